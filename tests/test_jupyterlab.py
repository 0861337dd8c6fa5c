"""JupyterLab serves the notebooks as they are: start it headless on loopback and read nbs/10_train.ipynb
through its contents API."""
import json
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def test_jupyterlab_serves_the_train_template(tmp_path):
    port, token = _free_port(), secrets.token_hex(16)
    cmd = [str(BIN / 'jupyter-lab'), '--no-browser', '--allow-root', '--ip=127.0.0.1', f'--port={port}', f'--IdentityProvider.token={token}',
           f'--ServerApp.root_dir={ROOT}', '--ServerApp.open_browser=False', '--LabServerApp.workspaces_dir=' + str(tmp_path / 'ws')]
    env_home = {'JUPYTER_RUNTIME_DIR': str(tmp_path / 'runtime'), 'JUPYTER_CONFIG_DIR': str(tmp_path / 'config')}
    import os
    proc = subprocess.Popen(cmd, cwd=tmp_path, env={**os.environ, **env_home}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = f'http://127.0.0.1:{port}/api/contents/nbs/10_train.ipynb?content=1'
        deadline, body = time.time() + 120, None
        while time.time() < deadline and body is None:
            if proc.poll() is not None: break
            try:
                req = urllib.request.Request(url, headers={'Authorization': f'token {token}'})
                body = json.loads(urllib.request.urlopen(req, timeout=5).read())
            except OSError:
                time.sleep(1)
        assert body is not None, 'JupyterLab did not answer: ' + (proc.stdout.read() if proc.poll() is not None else '')
        assert body['type'] == 'notebook' and body['name'] == '10_train.ipynb'
        nb = body['content']
        assert nb['metadata']['kernelspec']['name'] == 'python3'
        assert any('parameters' in c['metadata'].get('tags', []) for c in nb['cells'])
        # the kernelspec Lab would start is the venv's own interpreter
        ks = json.loads(urllib.request.urlopen(urllib.request.Request(f'http://127.0.0.1:{port}/api/kernelspecs',
                                                                      headers={'Authorization': f'token {token}'}), timeout=5).read())
        argv0 = ks['kernelspecs']['python3']['spec']['argv'][0]
        assert Path(argv0).resolve().parent == BIN.resolve() or argv0 == sys.executable, argv0
    finally:
        proc.terminate()
        try: proc.wait(timeout=20)
        except subprocess.TimeoutExpired: proc.kill()
