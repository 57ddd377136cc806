#!/usr/bin/env python3
"""Print one closing line with the test totals of every JUnit XML report in a folder.

The noxfile makes each pytest run write ``.nox/_reports/<session>.xml``; ``.ci/run`` calls
``python3 tools/ci_summary.py .nox/_reports`` after nox.  Output (last line)::

    tests: 812 passed, 0 failed, 3 skipped
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def totals(folder: Path) -> tuple[dict[str, int], list[str]]:
    sums = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    per_report = []
    for report in sorted(folder.glob("*.xml")):
        try:
            root = ET.parse(report).getroot()
        except ET.ParseError as exc:
            per_report.append(f"{report.stem}: unreadable report ({exc})")
            continue
        suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
        counts = {k: sum(int(s.get(k, 0)) for s in suites) for k in sums}
        for k in sums:
            sums[k] += counts[k]
        passed = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
        bad, skipped = counts["failures"] + counts["errors"], counts["skipped"]
        per_report.append(f"{report.stem}: {passed} passed, {bad} failed, {skipped} skipped")
    return sums, per_report


def main(argv: list[str]) -> int:
    folder = Path(argv[1] if len(argv) > 1 else ".nox/_reports")
    sums, per_report = totals(folder)
    for line in per_report:
        print(f"  {line}")
    failed = sums["failures"] + sums["errors"]
    passed = sums["tests"] - failed - sums["skipped"]
    print(f"tests: {passed} passed, {failed} failed, {sums['skipped']} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
