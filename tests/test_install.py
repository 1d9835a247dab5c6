"""``pip install -e .`` makes the project a package with its CLI as a command, usable from any folder."""

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.conftest import ROOT


@pytest.mark.slow
def test_an_editable_install_runs_the_cli_command_from_another_folder(tmp_path: Path) -> None:
    prefix = tmp_path / "prefix"
    install = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation"]
    subprocess.run([*install, "--prefix", str(prefix), "-e", str(ROOT)], check=True, capture_output=True)
    site_packages = next(prefix.glob("lib/python*/site-packages"))
    script = prefix / "bin" / "lightning-template"
    # the installed command, run as the shell would, with the prefix as a site folder (its .pth file read)
    run = (
        f"import runpy, site, sys; site.addsitedir({str(site_packages)!r}); "
        f"sys.argv = ['lightning-template', 'fit', '--config', {str(ROOT / 'configs' / 'digits.yaml')!r}, "
        "'--print_config']; "
        f"runpy.run_path({str(script)!r}, run_name='__main__')"
    )
    (tmp_path / "elsewhere").mkdir()
    shown = subprocess.run(
        [sys.executable, "-c", run], cwd=tmp_path / "elsewhere", capture_output=True, text=True, check=False
    )
    assert shown.returncode == 0, shown.stderr
    assert "class_path: src.models.Classifier" in shown.stdout  # configs/digits.yaml, merged
    assert "name: digits" in shown.stdout


def test_the_licence_file_is_the_one_pyproject_names() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "MIT"
    assert project["license-files"] == ["LICENSE"]
    assert (ROOT / "LICENSE").read_text().startswith("MIT License\n")
