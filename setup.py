"""Builds the optional compiled core, one module per concern beside the pure-Python code it speeds up (`COMPILED`);
everything else is in pyproject.toml.

As with pyiceberg's Avro decoder, the compiled core is a fast path, not a requirement: when it cannot be built (no C
compiler), the install still succeeds and tank-log runs on its pure-Python codec (`tank_log.format.native` says
which one is in use). Set TANK_LOG_REQUIRE_NATIVE=1 to make a failed build fail the install instead.
"""

import os

from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    def run(self) -> None:
        try:
            super().run()
        except Exception as err:  # a missing compiler surfaces here
            self._skip(err)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as err:
            self._skip(err)

    def _skip(self, err: Exception) -> None:
        if os.environ.get("TANK_LOG_REQUIRE_NATIVE"):
            raise err
        print(f"WARNING: tank-log's compiled core was not built ({err}); the pure-Python codec will be used")


COMPILED = {
    "tank_log.format._codec": "tank_log/format/_codec.pyx",  # the walk, decode, encoders, Arrow gather (§3)
    "tank_log.tools._dump_lines": "tank_log/tools/_dump_lines.pyx",  # `tank-log dump`'s JSON lines
    "tank_log.maintenance.compaction._key_map": "tank_log/maintenance/compaction/_key_map.pyx",  # the key map (§6.2)
    "tank_log.values._avro_fast": "tank_log/values/_avro_fast.pyx",  # Avro values into columns, in bulk
    "tank_log.values._protobuf_fast": "tank_log/values/_protobuf_fast.pyx",  # Protobuf values into columns, in bulk
}

setup(
    ext_modules=cythonize(
        [Extension(name, [path]) for name, path in COMPILED.items()],
        compiler_directives={"language_level": "3"},
    ),
    cmdclass={"build_ext": OptionalBuildExt},
)
