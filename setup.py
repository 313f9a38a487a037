"""Only what pyproject.toml cannot say: ship the DETOK_PLUGIN start-up hooks (.pth files)."""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HOOKS = ("detok_plugin_transformers.pth", "detok_plugin_tgi.pth")


class build_py_with_hook(build_py):
    """Copy the one-line .pth hooks to the wheel's root, where site-packages will read them."""

    def run(self):
        super().run()
        for hook in HOOKS:
            self.copy_file(str(Path("integrations") / hook), str(Path(self.build_lib) / hook))

    def get_outputs(self, include_bytecode=True):
        return super().get_outputs(include_bytecode) + [str(Path(self.build_lib) / hook) for hook in HOOKS]

    def get_output_mapping(self):
        mapping = super().get_output_mapping()
        for hook in HOOKS:
            mapping[str(Path(self.build_lib) / hook)] = str(Path("integrations") / hook)
        return mapping


setup(cmdclass={"build_py": build_py_with_hook})
