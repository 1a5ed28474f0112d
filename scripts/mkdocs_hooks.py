"""mkdocs hook: the reference pages generated from the code (scripts/docs_reference.py) join the site's files."""

import os
import sys

from mkdocs.structure.files import File

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # docs_reference.py, beside this file

from docs_reference import cli_reference, config_reference  # noqa: E402


def on_files(files, config):
    for path, text in (("reference/cli.md", cli_reference()), ("reference/configuration.md", config_reference())):
        files.append(File.generated(config, path, content=text))
    return files
