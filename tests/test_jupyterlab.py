"""JupyterLab serves the notebooks as they are: start it headless on loopback and read nbs/10_train.ipynb
through its contents API; then drive it in headless Chromium as a person would and run the train template."""

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_jupyterlab_serves_the_train_template(tmp_path):
    port, token = _free_port(), secrets.token_hex(16)
    cmd = [
        str(BIN / "jupyter-lab"),
        "--no-browser",
        "--allow-root",
        "--ip=127.0.0.1",
        f"--port={port}",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={ROOT}",
        "--ServerApp.open_browser=False",
        "--LabServerApp.workspaces_dir=" + str(tmp_path / "ws"),
    ]
    env_home = {"JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"), "JUPYTER_CONFIG_DIR": str(tmp_path / "config")}
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, env={**os.environ, **env_home}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        url = f"http://127.0.0.1:{port}/api/contents/nbs/10_train.ipynb?content=1"
        deadline, body = time.time() + 120, None
        while time.time() < deadline and body is None:
            if proc.poll() is not None:
                break
            try:
                req = urllib.request.Request(url, headers={"Authorization": f"token {token}"})
                body = json.loads(urllib.request.urlopen(req, timeout=5).read())
            except OSError:
                time.sleep(1)
        assert body is not None, "JupyterLab did not answer: " + (proc.stdout.read() if proc.poll() is not None else "")
        assert body["type"] == "notebook" and body["name"] == "10_train.ipynb"
        nb = body["content"]
        assert nb["metadata"]["kernelspec"]["name"] == "python3"
        assert any("parameters" in c["metadata"].get("tags", []) for c in nb["cells"])
        # the kernelspec Lab would start is the venv's own interpreter
        ks = json.loads(
            urllib.request.urlopen(
                urllib.request.Request(
                    f"http://127.0.0.1:{port}/api/kernelspecs", headers={"Authorization": f"token {token}"}
                ),
                timeout=5,
            ).read()
        )
        argv0 = ks["kernelspecs"]["python3"]["spec"]["argv"][0]
        assert Path(argv0).resolve().parent == BIN.resolve() or argv0 == sys.executable, argv0
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


# ------------------------------------------------------------------------------------------------------------------
# JupyterLab driven as a person would: headless Chromium opens nbs/10_train.ipynb, runs every cell through the UI
# ------------------------------------------------------------------------------------------------------------------
CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
ARTIFACTS = Path(os.environ.get("DEPTHBENCH_TEST_ARTIFACTS", ROOT / ".cache" / "test-artifacts"))


def _browser_or_skip():
    "Selenium and Debian's chromium + chromium-driver; in CI (CI=true) their absence is a failure, not a skip."
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("selenium (requirements-dev.txt)")
    if missing:
        why = (
            f"JupyterLab browser test needs {', '.join(missing)} "
            "(apt-get install -y chromium chromium-driver; .ci/run does)"
        )
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(why)
        pytest.skip(why)


def _chromium(profile: Path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = str(CHROMIUM)
    # as root, headless, and quiet on a closed network (no background fetches, updates, sync or first-run pages)
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--disable-extensions",
        f"--user-data-dir={profile}",
        "--window-size=1400,1000",
    ):
        opts.add_argument(arg)
    return webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=opts)


def test_train_template_runs_in_jupyterlab_in_chromium(tmp_path, tiny_data, monkeypatch):
    _browser_or_skip()
    monkeypatch.setenv("SE_OFFLINE", "true")  # Selenium must not look for drivers on the network: both are given
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    # Lab serves a copy of the template (Lab saves what it runs: the repository's notebook must stay clean)
    lab_root = tmp_path / "lab"
    (lab_root / "nbs").mkdir(parents=True)
    notebook = lab_root / "nbs" / "10_train.ipynb"
    shutil.copy(ROOT / "nbs" / "10_train.ipynb", notebook)
    n_cells = len(json.loads(notebook.read_text())["cells"])
    settings = tmp_path / "settings" / "@jupyterlab"
    (settings / "notebook-extension").mkdir(parents=True)
    (settings / "apputils-extension").mkdir(parents=True)
    # every cell in the DOM (no windowed rendering), no bracket auto-closing while typing, no news or update checks
    (settings / "notebook-extension" / "tracker.jupyterlab-settings").write_text(
        json.dumps({"windowingMode": "none", "codeCellConfig": {"autoClosingBrackets": False}})
    )
    (settings / "apputils-extension" / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False})
    )
    port, token, runs = _free_port(), secrets.token_hex(16), tmp_path / "runs"
    cmd = [
        str(BIN / "jupyter-lab"),
        "--no-browser",
        "--allow-root",
        "--ip=127.0.0.1",
        f"--port={port}",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={lab_root}",
        f"--LabServerApp.workspaces_dir={tmp_path / 'ws'}",
        f"--LabServerApp.user_settings_dir={tmp_path / 'settings'}",
    ]
    env = dict(
        os.environ,
        DEPTHBENCH_RUNS=str(runs),
        JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),
        JUPYTER_CONFIG_DIR=str(tmp_path / "config"),
        SE_OFFLINE="true",
    )
    log = open(tmp_path / "lab.log", "w")
    lab = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT)
    driver = None
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "jupyterlab_10_train.png"

    def wait(what: str, cond, timeout: float = 120):
        end = time.time() + timeout
        while time.time() < end:
            try:
                if v := cond():
                    return v
            except Exception:
                pass
            if lab.poll() is not None:
                break
            time.sleep(0.5)
        driver.save_screenshot(str(ARTIFACTS / "jupyterlab_10_train_failed.png"))
        raise AssertionError(
            f"JupyterLab: timed out waiting for {what}; lab log:\n{(tmp_path / 'lab.log').read_text()[-3000:]}"
        )

    def menu(bar: str, item: str):
        driver.find_element(By.XPATH, f"//div[contains(@class,'lm-MenuBar-itemLabel') and text()='{bar}']").click()
        wait(
            f"menu item {item}",
            lambda: driver.find_element(
                By.XPATH,
                f"//li[contains(@class,'lm-Menu-item')]/div[contains(@class,'lm-Menu-itemLabel') and text()='{item}']",
            ),
        ).click()

    try:
        driver = _chromium(tmp_path / "chromium-profile")
        wait(
            "the server", lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status?token={token}", timeout=2)
        )
        driver.get(f"http://127.0.0.1:{port}/lab/tree/nbs/10_train.ipynb?token={token}")

        def cells():
            return driver.find_elements(By.CSS_SELECTOR, ".jp-NotebookPanel .jp-Notebook .jp-Cell")

        wait("the notebook", lambda: len(cells()) == n_cells)
        # as a user would: type the overrides at the end of the parameters cell (a CPU-sized run on the test data)
        # the parameters cell (either quote: the template is as `ruff format` leaves it)
        params = next(c for c in cells() if any(f"arch = {q}attnres{q}" in c.text for q in "\"'"))
        params.find_element(By.CSS_SELECTOR, ".cm-content").click()
        ActionChains(driver).key_down(Keys.CONTROL).send_keys(Keys.END).key_up(Keys.CONTROL).perform()
        ActionChains(driver).send_keys(
            Keys.ENTER,
            "L = 2",
            Keys.ENTER,
            "d_model = 32",
            Keys.ENTER,
            "max_steps = 3",
            Keys.ENTER,
            "eval_every = 3",
            Keys.ENTER,
            f'data = "{tiny_data}"',
            Keys.ENTER,
            'study = "lab"',
        ).perform()
        wait("the typed parameters", lambda: 'study = "lab"' in params.text, 20)
        menu("Run", "Run All Cells")

        def prompts():
            return [
                p.text.strip()
                for p in driver.find_elements(By.CSS_SELECTOR, ".jp-NotebookPanel .jp-CodeCell .jp-InputArea-prompt")
            ]

        wait("every cell to run", lambda: all(p not in ("", "[ ]:", "[*]:") for p in prompts()), 600)
        menu("File", "Save Notebook")
        wait(
            "the save",
            lambda: any(
                o.get("output_type") for c in json.loads(notebook.read_text())["cells"] for o in c.get("outputs", [])
            ),
            30,
        )
        driver.save_screenshot(str(shot))
        saved = json.loads(notebook.read_text())
        code = [c for c in saved["cells"] if c["cell_type"] == "code"]
        assert all(c.get("execution_count") for c in code), [c.get("execution_count") for c in code]
        errors = [o for c in code for o in c.get("outputs", []) if o.get("output_type") == "error"]
        assert not errors, errors[0].get("traceback", errors[0])[-3:]
        assert not driver.find_elements(
            By.CSS_SELECTOR, '.jp-OutputArea-output [data-mime-type="application/vnd.jupyter.error"]'
        )
        (result,) = list((runs / "lab").glob("*/result.json"))
        record = json.loads(result.read_text())
        assert (
            record["status"] == "completed"
            and record["steps"] == 3
            and record["arch"] == "attnres"
            and record["n_layer"] == 2
        )
        assert any(
            "completed" in "".join(o.get("text", "")) for o in code[-1].get("outputs", [])
        )  # the final-metrics table
        assert shot.stat().st_size > 10_000
    finally:
        if driver is not None:
            driver.quit()
        lab.terminate()
        try:
            lab.wait(timeout=30)
        except subprocess.TimeoutExpired:
            lab.kill()
            lab.wait()
        log.close()
