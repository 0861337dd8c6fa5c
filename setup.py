"""Packaging in the nbdev 2 style: metadata and requirements come from settings.ini.

The papermill templates and report notebooks (nbs/1*.ipynb, nbs/2*.ipynb) are copied into the wheel as
package data (depthbench_nb/notebooks/) at build time, so `depthbench-nb notebooks DIR` works without a clone.
"""

import shutil
from configparser import ConfigParser
from pathlib import Path

import setuptools
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

here = Path(__file__).parent
cfg = ConfigParser(delimiters=["="])
cfg.read(here / "settings.ini", encoding="utf-8")
cfg = cfg["DEFAULT"]

licenses = {"apache2": ("Apache Software License 2.0", "OSI Approved :: Apache Software License")}
statuses = [
    "1 - Planning",
    "2 - Pre-Alpha",
    "3 - Alpha",
    "4 - Beta",
    "5 - Production/Stable",
    "6 - Mature",
    "7 - Inactive",
]
py_versions = "3.10 3.11 3.12 3.13".split()
lic = licenses[cfg["license"].lower()]
min_python = cfg["min_python"]

requirements = cfg.get("requirements", "").split()
if cfg.get("pip_requirements"):
    requirements += cfg.get("pip_requirements", "").split()
dev_requirements = (cfg.get("dev_requirements") or "").split()
extras = {name: (cfg.get(f"{name}_requirements") or "").split() for name in ("hf", "eval", "tensorboard", "wandb")}
extras["trackers"] = extras["tensorboard"] + extras["wandb"]
console_scripts = cfg.get("console_scripts", "").split()


# A startup hook (site-packages/depthbench_nb-hooks.pth): in every interpreter of the environment it imports
# depthbench_nb._hooks, which only watches for Transformers' Auto classes and lm-eval's model registry to load and
# then registers the 'depthbench' model type with them, so `lm_eval --model depthbench` works from the shell. It
# imports nothing heavy and does nothing if the package is gone.
HOOK_PTH = "depthbench_nb-hooks.pth"
HOOK_LINE = "import sys; exec('try:\\n import depthbench_nb._hooks\\nexcept Exception:\\n pass')\n"


class build_py_with_notebooks(build_py):
    "Copy the papermill templates (10-19) and reports (20-29) into the package; put the startup hook beside it."

    def run(self):
        super().run()
        dest = Path(self.build_lib) / cfg["lib_name"] / "notebooks"
        dest.mkdir(parents=True, exist_ok=True)
        for nb in sorted((here / cfg["nbs_path"]).glob("[12][0-9]_*.ipynb")):
            shutil.copy2(nb, dest / nb.name)
        (Path(self.build_lib) / HOOK_PTH).write_text(HOOK_LINE)

    def get_outputs(self, include_bytecode=True):
        return super().get_outputs(include_bytecode) + [str(Path(self.build_lib) / HOOK_PTH)]


class editable_wheel_with_hook(editable_wheel):
    "Editable installs (pip install -e .) get the same startup hook."

    def _create_wheel_file(self, bdist_wheel):
        from wheel.wheelfile import WheelFile

        path = super()._create_wheel_file(bdist_wheel)
        with WheelFile(path, "a") as whl:
            whl.writestr(HOOK_PTH, HOOK_LINE)
        return path


setuptools.setup(
    name=cfg["repo"],
    license=lic[0],
    classifiers=[
        "Development Status :: " + statuses[int(cfg["status"])],
        "Intended Audience :: " + cfg["audience"].title(),
        "License :: " + lic[1],
        "Natural Language :: " + cfg["language"].title(),
    ]
    + ["Programming Language :: Python :: " + o for o in py_versions[py_versions.index(min_python) :]],
    url=cfg["git_url"],
    packages=setuptools.find_packages(include=[cfg["lib_name"], cfg["lib_name"] + ".*"]),
    include_package_data=True,
    package_data={cfg["lib_name"]: ["resources/*", "resources/**/*"]},
    install_requires=requirements,
    extras_require={"dev": dev_requirements, **extras},
    python_requires=">=" + min_python,
    long_description=(here / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    zip_safe=False,
    entry_points={"console_scripts": console_scripts, "nbdev": [f"{cfg['lib_path']}={cfg['lib_path']}._modidx:d"]},
    cmdclass={"build_py": build_py_with_notebooks, "editable_wheel": editable_wheel_with_hook},
    version=cfg["version"],
    description=cfg["description"],
    author=cfg["author"],
    author_email=cfg["author_email"],
    keywords=cfg["keywords"],
)
