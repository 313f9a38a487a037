"""Only what pyproject.toml cannot say: ship the DETOK_PLUGIN start-up hook (a .pth file)."""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HOOK = "detok_plugin_transformers.pth"


class build_py_with_hook(build_py):
    """Copy the one-line .pth hook to the wheel's root, where site-packages will read it."""

    def run(self):
        super().run()
        self.copy_file(str(Path("integrations") / HOOK), str(Path(self.build_lib) / HOOK))

    def get_outputs(self, include_bytecode=True):
        return super().get_outputs(include_bytecode) + [str(Path(self.build_lib) / HOOK)]

    def get_output_mapping(self):
        mapping = super().get_output_mapping()
        mapping[str(Path(self.build_lib) / HOOK)] = str(Path("integrations") / HOOK)
        return mapping


setup(cmdclass={"build_py": build_py_with_hook})
