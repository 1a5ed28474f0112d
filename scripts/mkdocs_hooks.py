"""mkdocs hook: the reference pages generated from the code (tank_log/tools/reference.py) join the site's files."""

from mkdocs.structure.files import File

from tank_log.tools.reference import cli_reference, config_reference


def on_files(files, config):
    for path, text in (("reference/cli.md", cli_reference()), ("reference/configuration.md", config_reference())):
        files.append(File.generated(config, path, content=text))
    return files
