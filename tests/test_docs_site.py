"""The built docs site as a reader gets it: links where the prose cites the format reference or uses a glossary term,
and, in headless Chromium with no network, pages that load, diagrams drawn as SVG, a search that finds, nothing cut
off at the right edge, and no paragraph longer than a reader takes in at once."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from functools import partial
from html.parser import HTMLParser
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT

MAX_LINES = 6  # rendered lines of one paragraph or list item, at a laptop's width
WIDTH, HEIGHT = 1366, 900
# Pages whose prose is not ours to cut, and why.
LONG_PARAGRAPHS_ALLOWED = {
    "guides/airflow/": "being rewritten with the Airflow demo (scripts/airflow-demo.sh); drop this entry then",
}
# Pages whose wide blocks may scroll sideways instead of fitting the column, and why.
WIDE_BLOCKS_ALLOWED = {
    "ARCHITECTURE/": "the layer and data-flow diagrams are drawn in text, one line per module",
    "FORMAT/": "byte layouts, one field per line as the broker's source declares them",
    "reference/benchmarks/": "bench/RESULTS.md's result tables, one column per measured figure",
    "guides/airflow/": "being rewritten with the Airflow demo (scripts/airflow-demo.sh); drop this entry then",
}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    mkdocs = os.path.join(os.path.dirname(sys.executable), "mkdocs")
    r = subprocess.run(
        [mkdocs, "build", "--strict", "-d", str(out)],  # not --quiet: it hides the warnings that abort the build
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=dict(os.environ, NO_MKDOCS_2_WARNING="1", PYTHONPATH=ROOT),
    )
    assert r.returncode == 0 and "WARNING" not in r.stderr, r.stderr[-3000:]
    return out


def pages(site: Path) -> list[str]:
    """Every page of the site as its URL path (`guides/jobs/`)."""
    found = []
    for html in sorted(site.rglob("index.html")):
        rel = html.parent.relative_to(site).as_posix()
        found.append("" if rel == "." else rel + "/")
    return found


class Prose(HTMLParser):
    """The text of a page's article outside code and links, and the glossary links it has."""

    def __init__(self) -> None:
        super().__init__()
        self.depth = {"code": 0, "pre": 0, "a": 0, "article": 0, "h1": 0, "h2": 0, "h3": 0, "script": 0}
        self.unlinked: list[str] = []
        self.glossary_links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self.depth:
            self.depth[tag] += 1
        href = dict(attrs).get("href") or ""
        if tag == "a" and "glossary/#" in href:
            self.glossary_links.append(href.split("#", 1)[1])

    def handle_endtag(self, tag: str) -> None:
        if tag in self.depth and self.depth[tag]:
            self.depth[tag] -= 1

    def handle_data(self, data: str) -> None:
        d = self.depth
        if d["article"] and not (d["code"] or d["pre"] or d["a"] or d["script"] or d["h1"] or d["h2"] or d["h3"]):
            self.unlinked.append(data)


def prose(site: Path, page: str) -> Prose:
    p = Prose()
    p.feed((site / page / "index.html").read_text(encoding="utf-8"))
    return p


def test_every_format_citation_is_a_link(site):
    """ "§6.2" in the prose of any page links to that section of the format reference (citations inside code, e.g. a
    quoted error message, stay text)."""
    bare = {}
    for page in pages(site):
        text = " ".join(prose(site, page).unlinked)
        if "§" in text:
            i = text.index("§")
            bare[page] = text[max(0, i - 40) : i + 20]
    assert bare == {}


def test_glossary_terms_link_where_first_used(site):
    """The jargon a new reader meets has a definition, and the pages using it link there."""
    glossary = (site / "glossary" / "index.html").read_text(encoding="utf-8")
    for term in ("ro-segment", "seq", "bundle", "sparse-bundle", "dirty-ratio", "holder-check", "torn-tail",
                 "app-transaction", "appcds"):  # fmt: skip
        assert f'id="{term}"' in glossary, term
    compaction = prose(site, "guides/compaction/").glossary_links
    assert {"ro-segment", "seq", "sparse-bundle", "dirty-ratio"} <= set(compaction)
    assert len(compaction) == len(set(compaction))  # the first use only
    assert "app-transaction" in prose(site, "guides/export/").glossary_links
    assert "appcds" in prose(site, "guides/cluster/").glossary_links


def test_the_header_has_no_repository_button(site):
    """No URL is known for this project: the header links to no repository (the broker's was there)."""
    assert "md-source" not in (site / "index.html").read_text(encoding="utf-8")


def test_the_site_loads_nothing_from_elsewhere(site):
    """No web fonts or scripts from a CDN: every script and stylesheet the pages load is the site's own."""
    for page in pages(site):
        html = (site / page / "index.html").read_text(encoding="utf-8")
        for attr in ('src="http', 'href="https://fonts', 'rel="stylesheet" href="http'):
            assert attr not in html, (page, attr)
    assert (site / "assets" / "vendor" / "mermaid.min.js").stat().st_size > 1_000_000


# ---- in Chromium ----


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def served(site: Path) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(Quiet, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


class Browser:
    """Headless Chromium through chromedriver's WebDriver protocol (plain HTTP on loopback, no client library)."""

    def __init__(self, profile: Path):
        chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
        assert chromium and driver
        self.port = _free_port()
        self.proc = subprocess.Popen(
            [driver, f"--port={self.port}", "--allowed-ips=127.0.0.1"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                if self._call("GET", "/status")["ready"]:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "chromedriver did not start"
            time.sleep(0.2)
        args = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            f"--user-data-dir={profile}",
            f"--window-size={WIDTH},{HEIGHT}",
            # no network: every host name but loopback fails to resolve
            "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
        ]
        caps = {"browserName": "chrome", "goog:chromeOptions": {"binary": chromium, "args": args}}
        self.session = self._call("POST", "/session", {"capabilities": {"alwaysMatch": caps}})["sessionId"]
        # Material draws each diagram into a closed shadow root; open ones let the test see the SVG.
        self.cdp(
            "Page.addScriptToEvaluateOnNewDocument",
            {
                "source": "const attach = Element.prototype.attachShadow;"
                "Element.prototype.attachShadow = function (init) {"
                " return attach.call(this, Object.assign({}, init, {mode: 'open'})); };"
            },
        )

    def _call(self, method: str, path: str, body: object = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data, method=method)
        req.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(req, timeout=120) as resp:
            return json.loads(resp.read())["value"]

    def cdp(self, cmd: str, params: dict[str, Any]) -> Any:
        return self._call("POST", f"/session/{self.session}/goog/cdp/execute", {"cmd": cmd, "params": params})

    def get(self, url: str) -> None:
        self._call("POST", f"/session/{self.session}/url", {"url": url})

    def js(self, script: str, *args: object) -> Any:
        return self._call("POST", f"/session/{self.session}/execute/sync", {"script": script, "args": list(args)})

    def wait_for(self, script: str, what: str, timeout_s: float = 20) -> Any:
        deadline = time.monotonic() + timeout_s
        while True:
            value = self.js(script)
            if value:
                return value
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.2)

    def close(self) -> None:
        try:
            self._call("DELETE", f"/session/{self.session}")
        finally:
            self.proc.terminate()
            self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    if not (shutil.which("chromium") and shutil.which("chromedriver")):
        if os.environ.get("CI"):
            pytest.fail("chromium and chromedriver are missing: scripts/setup.sh installs them")
        pytest.skip("no chromium/chromedriver (apt-get install chromium chromium-driver; scripts/setup.sh does)")
    b = Browser(tmp_path_factory.mktemp("chromium-profile"))
    yield b
    b.close()


FOREIGN_REQUESTS = """
return performance.getEntriesByType('resource').map(e => e.name)
    .filter(u => !u.startsWith(location.origin) && !u.startsWith('data:') && !u.startsWith('blob:'));
"""

OVERFLOW = """
const root = document.documentElement;
const cut = [];
if (root.scrollWidth > root.clientWidth + 1) cut.push('page: ' + root.scrollWidth + ' > ' + root.clientWidth);
const article = document.querySelector('article').getBoundingClientRect();
for (const el of document.querySelectorAll('article pre, article table')) {
    let scrolls = false;
    const code = el.tagName === 'PRE' ? el.querySelector('code') : null;
    for (let p = code || el; p && p !== document.body; p = p.parentElement) {
        const o = getComputedStyle(p).overflowX;
        if ((o === 'auto' || o === 'scroll') && p.getBoundingClientRect().right <= article.right + 1) scrolls = true;
    }
    const inner = el.tagName === 'PRE' ? el.querySelector('code') || el : el;
    const fits = el.getBoundingClientRect().right <= article.right + 1 && inner.scrollWidth <= inner.clientWidth + 1;
    if (!fits && !(scrolls && !arguments[0])) cut.push(el.tagName + ': ' + el.textContent.slice(0, 60));
}
return cut;
"""

LONG_PARAGRAPHS = """
const long = [];
for (const el of document.querySelectorAll('article p, article li')) {
    if (el.tagName === 'LI' && el.querySelector('p, ul, ol')) continue;  // measured by its own paragraphs
    const style = getComputedStyle(el);
    const lines = Math.round(el.getBoundingClientRect().height / parseFloat(style.lineHeight));
    if (lines > arguments[0]) long.push(lines + ' lines: ' + el.textContent.slice(0, 70));
}
return long;
"""


@pytest.mark.slow
def test_the_site_works_offline_in_chromium(browser, served, site):
    """The home page, a guide, the generated references and a page with diagrams load with no network; each diagram
    is drawn as an SVG; nothing is cut off at the right edge (at a laptop's width)."""
    for page in ("", "guides/compaction/", "reference/cli/", "reference/configuration/", "guides/jobs/"):
        browser.get(served + page)
        browser.wait_for("return document.readyState === 'complete'", f"{page or 'home'} to load")
        assert browser.js("return document.querySelector('article h1').textContent"), page
        assert browser.js(FOREIGN_REQUESTS) == [], page
        assert browser.js(OVERFLOW, False) == [], page  # nothing cut off: a wide block at least scrolls
    for page in ("guides/jobs/", "operations/crash-safety/", "guides/production/"):
        browser.get(served + page)
        expected = (site / page / "index.html").read_text(encoding="utf-8").count('class="mermaid"')
        assert expected >= 1, page
        drawn = browser.wait_for(
            "const d = [...document.querySelectorAll('div.mermaid')]"
            ".filter(e => e.shadowRoot && e.shadowRoot.querySelector('svg g'));"
            f"return d.length === {expected} && d.map(e => e.getBoundingClientRect().height);",
            f"the diagrams of {page} to be drawn",
        )
        assert all(h > 50 for h in drawn), (page, drawn)
        assert browser.js("return document.querySelectorAll('pre.mermaid').length") == 0
        assert browser.js(FOREIGN_REQUESTS) == [], page


@pytest.mark.slow
def test_search_finds_offline(browser, served):
    browser.get(served + "guides/jobs/")
    browser.wait_for("return document.readyState === 'complete'", "the page to load")
    for query, expected in (("exit codes", "exit-codes"), ("key_state_budget", "compaction")):
        browser.js(
            "const input = document.querySelector('.md-search__input');"
            "document.querySelector('#__search').checked = true;"
            "input.focus(); input.value = arguments[0];"
            "input.dispatchEvent(new KeyboardEvent('keyup', {key: 'e'}));",
            query,
        )
        hrefs = browser.wait_for(
            "return [...document.querySelectorAll('.md-search-result__item a')].map(a => a.href);",
            f"search results for {query!r}",
        )
        assert any(expected in h for h in hrefs), (query, hrefs[:5])
    assert browser.js(FOREIGN_REQUESTS) == []


@pytest.mark.slow
def test_no_paragraph_is_a_wall_of_text(browser, served, site):
    """Measured as rendered at a laptop's width: no paragraph or list item of any page is longer than MAX_LINES."""
    walls = {}
    for page in pages(site):
        if page in LONG_PARAGRAPHS_ALLOWED or page.startswith("404"):
            continue
        browser.get(served + page)
        browser.wait_for("return document.readyState === 'complete'", f"{page} to load")
        long = browser.js(LONG_PARAGRAPHS, MAX_LINES)
        if long:
            walls[page] = long
    assert walls == {}


@pytest.mark.slow
def test_code_and_tables_fit_the_column(browser, served, site):
    """At a laptop's width, every code block and table of every page fits the content column (a table's long cells
    wrap): nothing needs scrolling sideways to be read, so nothing looks cut off."""
    wide = {}
    for page in pages(site):
        if page in WIDE_BLOCKS_ALLOWED or page.startswith("404"):
            continue
        browser.get(served + page)
        browser.wait_for("return document.readyState === 'complete'", f"{page} to load")
        cut = browser.js(OVERFLOW, True)
        if cut:
            wide[page] = cut
    assert wide == {}


def test_common_questions_are_one_click_from_home(site):
    """Each common question is answered in a section whose heading names it, linked from the home page."""
    import re

    home = (site / "index.html").read_text(encoding="utf-8")
    questions = {
        "nightly compaction on a cluster": "guides/cluster/#nightly-compaction-on-a-cluster",
        "exit code 3": "operations/exit-codes/#exit-code-3-done-partially",
        "retention that keeps what the lakehouse lacks": (
            "guides/retention/#retention-that-keeps-what-the-lakehouse-lacks"
        ),
        "tank data in a dataframe": "guides/reading/",
        "reading the exported table": "guides/read-the-table/",
        "restoring one partition": "guides/import/#restoring-one-partition",
        "the key memory budget": "guides/compaction/#the-key-memory-budget",
        "metrics and alerts": "operations/monitoring/",
        "restoring a lost broker host from the lakehouse": (
            "guides/import/#restoring-a-lost-broker-host-from-the-lakehouse"
        ),
    }
    for words, target in questions.items():
        assert f'href="{target}"' in home, target
        page, _, anchor = target.partition("#")
        html = (site / page / "index.html").read_text(encoding="utf-8")
        if anchor:
            heading = re.search(rf'<h[23] id="{anchor}">(.*?)<', html)
        else:
            heading = re.search(r"<h1[^>]*>(.*?)<", html)
        assert heading and words in heading.group(1).lower(), (target, heading and heading.group(1))
