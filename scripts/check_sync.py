"""Check that the notebooks are the source: `export` runs nbdev_export, `clean` runs nbdev_clean, and each
fails if it changed a file (the package did not match the notebooks, or a notebook was not clean)."""

import hashlib
import subprocess
import sys
from pathlib import Path

root = Path(__file__).resolve().parent.parent
what = sys.argv[1]
folder, tool = {"export": ("depthbench_nb", "nbdev_export"), "clean": ("nbs", "nbdev_clean")}[what]
bin_dir = Path(sys.executable).parent


def snapshot():
    files = sorted(
        p
        for p in (root / folder).rglob("*")
        if p.is_file()
        and "__pycache__" not in p.parts
        and ".ipynb_checkpoints" not in p.parts
        and "notebooks" not in p.relative_to(root / folder).parts[:1]
    )
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


before = snapshot()
subprocess.run([str(bin_dir / tool)], cwd=root, check=True)
after = snapshot()
changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
if changed:
    print(f"{tool} changed {len(changed)} file(s): " + ", ".join(changed))
    print("The notebooks are the source: edit nbs/, run nbdev_export and nbdev_clean, and commit both.")
    sys.exit(1)
print(f"{tool}: no changes ({len(after)} files)")
