"""Build: the hot modules listed in `gateway/compiled.py`, compiled with mypyc.

Everything else is in pyproject.toml. Each module becomes a C extension next to its `.py`
(`pip install -e .` builds in place), which Python imports in its stead. Where mypyc is
missing, refuses a module, or the C compiler fails, the install goes on without the
extensions and the `.py` files run (the gateway says which at start).
`SPECROUTE_NO_COMPILE=1` skips compiling.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
HOT = runpy.run_path(str(ROOT / "gateway" / "compiled.py"))


def say(line: str) -> None:
    print(f"specroute build: {line}", file=sys.stderr)


def hot_extensions() -> list:
    if os.environ.get(HOT["NO_COMPILE_ENV"]) == "1":
        say(f"{HOT['NO_COMPILE_ENV']}=1: the hot path stays pure Python")
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        say("mypyc is not installed: the hot path stays pure Python")
        return []
    os.chdir(ROOT)  # mypyc names modules by their paths from the project root
    try:
        extensions = mypycify(list(HOT["COMPILED"]), opt_level="3",
                              group_name="hotpath", target_dir="build/mypyc")
    except (Exception, SystemExit) as exc:  # mypyc exits on a module it cannot compile
        say(f"mypyc failed ({exc!r}): the hot path stays pure Python")
        return []
    for extension in extensions:
        extension.optional = True  # a C compiler failure: setuptools warns and goes on
    return extensions


class BuildHot(build_ext):
    """setuptools' build_ext on the extensions mypyc makes, asked for only when building
    (not each time pip reads the metadata), then the manifest of what was compiled from
    which source (`gateway.compiled.stale` reads it)."""

    def finalize_options(self) -> None:
        self.distribution.ext_modules = hot_extensions()
        super().finalize_options()

    def run(self) -> None:
        super().run()
        built = {ext.name: HOT["source_digest"](ROOT / (ext.name.replace(".", "/") + ".py"))
                 for ext in self.extensions if "__mypyc" not in ext.name
                 and Path(self.get_ext_fullpath(ext.name)).exists()}
        manifest = Path(HOT["MANIFEST"])
        manifest.parent.mkdir(parents=True, exist_ok=True)
        manifest.write_text(json.dumps(built, indent=1, sort_keys=True))
        say(f"{len(built)} of {len(HOT['COMPILED'])} hot modules compiled")


# a stand-in that makes setuptools run build_ext (and tag the wheel for this platform)
setup(ext_modules=[Extension("hotpath__mypyc", sources=[])],
      cmdclass={"build_ext": BuildHot})
