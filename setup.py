"""Packaging in the nbdev 2 style: metadata and requirements come from settings.ini.

The papermill templates and report notebooks (nbs/1*.ipynb, nbs/2*.ipynb) are copied into the wheel as
package data (depthbench_nb/notebooks/) at build time, so `depthbench-nb notebooks DIR` works without a clone.
"""
import shutil
from configparser import ConfigParser
from pathlib import Path

import setuptools
from setuptools.command.build_py import build_py

here = Path(__file__).parent
cfg = ConfigParser(delimiters=['='])
cfg.read(here / 'settings.ini', encoding='utf-8')
cfg = cfg['DEFAULT']

licenses = {'apache2': ('Apache Software License 2.0', 'OSI Approved :: Apache Software License')}
statuses = ['1 - Planning', '2 - Pre-Alpha', '3 - Alpha', '4 - Beta', '5 - Production/Stable', '6 - Mature', '7 - Inactive']
py_versions = '3.10 3.11 3.12 3.13'.split()
lic = licenses[cfg['license'].lower()]
min_python = cfg['min_python']

requirements = cfg.get('requirements', '').split()
if cfg.get('pip_requirements'): requirements += cfg.get('pip_requirements', '').split()
dev_requirements = (cfg.get('dev_requirements') or '').split()
console_scripts = cfg.get('console_scripts', '').split()


class build_py_with_notebooks(build_py):
    "Copy the papermill templates (10-19) and reports (20-29) into the package."
    def run(self):
        super().run()
        dest = Path(self.build_lib) / cfg['lib_name'] / 'notebooks'
        dest.mkdir(parents=True, exist_ok=True)
        for nb in sorted((here / cfg['nbs_path']).glob('[12][0-9]_*.ipynb')):
            shutil.copy2(nb, dest / nb.name)


setuptools.setup(
    name=cfg['repo'],
    license=lic[0],
    classifiers=['Development Status :: ' + statuses[int(cfg['status'])],
                 'Intended Audience :: ' + cfg['audience'].title(),
                 'License :: ' + lic[1],
                 'Natural Language :: ' + cfg['language'].title()]
                + ['Programming Language :: Python :: ' + o for o in py_versions[py_versions.index(min_python):]],
    url=cfg['git_url'],
    packages=setuptools.find_packages(include=[cfg['lib_name'], cfg['lib_name'] + '.*']),
    include_package_data=True,
    package_data={cfg['lib_name']: ['resources/*', 'resources/**/*']},
    install_requires=requirements,
    extras_require={'dev': dev_requirements},
    python_requires='>=' + min_python,
    long_description=(here / 'README.md').read_text(encoding='utf-8'),
    long_description_content_type='text/markdown',
    zip_safe=False,
    entry_points={'console_scripts': console_scripts, 'nbdev': [f"{cfg['lib_path']}={cfg['lib_path']}._modidx:d"]},
    cmdclass={'build_py': build_py_with_notebooks},
    version=cfg['version'], description=cfg['description'], author=cfg['author'], author_email=cfg['author_email'],
    keywords=cfg['keywords'],
)
