"""Every thing this repository ships says its license, and says the same one as LICENSE.

A distribution without license metadata shows "UNKNOWN" on an index and fails the license
scanners of the people who would install it; a chart without one shows none on Artifact Hub;
an image label that disagrees with the file is worse than none.
"""
import re
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
LICENSE = "Apache-2.0"  # SPDX identifier of the text in LICENSE
PACKAGES = ("rdzv", "trainer", "operator")  # each holds one pyproject.toml, one distribution


def test_the_license_file_is_the_whole_apache_2_0_text():
    text = (ROOT / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License\n                           Version 2.0, January 2004")
    sections = re.findall(r"^\s+(\d+)\. [A-Z][\w ]+\.", text, re.MULTILINE)
    assert sections == [str(n) for n in range(1, 10)], "the nine sections of the license, in order"
    assert "END OF TERMS AND CONDITIONS" in text and "APPENDIX: How to apply the Apache License" in text


@pytest.mark.parametrize("package", PACKAGES)
def test_every_distribution_declares_the_license(package):
    project = tomllib.loads((ROOT / package / "pyproject.toml").read_text())["project"]
    assert project.get("license") == LICENSE, f"{package}/pyproject.toml: set license = \"{LICENSE}\""


def test_the_chart_declares_the_license():
    chart = yaml.safe_load((ROOT / "charts" / "ddpjob-operator" / "Chart.yaml").read_text())
    assert (chart.get("annotations") or {}).get("artifacthub.io/license") == LICENSE


def test_every_image_is_labelled_with_the_license():
    text = (ROOT / "Dockerfile").read_text()
    targets = re.findall(r"^FROM \S+ AS (operator|trainer)$", text, re.MULTILINE)
    labels = re.findall(r'org\.opencontainers\.image\.licenses="([^"]*)"', text)
    assert sorted(targets) == ["operator", "trainer"] and labels == [LICENSE] * len(targets)
