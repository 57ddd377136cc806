#!/usr/bin/env python3
"""Print the counts of a conformance run from its JUnit XML report.

``nox -s conformance`` runs TorchRL's replay-buffer tests (``../shared/conformance/torchrl-rb``)
against tdreplay and calls ``python tools/conformance_summary.py REPORT.xml``. Output: the
passed / failed / skipped / error counts, then the failures and errors grouped by exception type
and the first line of the message (largest groups first)::

    conformance: 794 passed, 3469 failed, 1078 skipped, 0 errors (of 5341)
    failures by cause (tests, exception: first line of the message):
      2498  TypeError: __init__() got an unexpected keyword argument 'compilable'
      ...
"""

from __future__ import annotations

import argparse
import re
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path


def _cause(element: ET.Element) -> str:
    """``Type: first line`` of a ``<failure>`` / ``<error>`` element, addresses blanked."""
    message = (element.get("message") or "").strip()
    kind = element.get("type") or ""
    if not message and element.text:  # pytest puts the traceback in the text
        errors = [line[2:].strip() for line in element.text.splitlines()
                  if line.startswith("E ")]
        message = errors[0] if errors else ""
    first = message.splitlines()[0] if message else ""
    if not kind and ": " in first and re.match(r"^[\w.]+: ", first):
        kind, first = first.split(": ", 1)
    elif kind and first.startswith(kind.rsplit(".", 1)[-1] + ": "):
        first = first.split(": ", 1)[1]
    if not kind and first.startswith("assert "):  # a bare assert: pytest gives no type
        kind = "AssertionError"
    first = re.sub(r"0x[0-9a-fA-F]+", "0x…", first)
    return f"{kind.rsplit('.', 1)[-1] or 'Error'}: {first[:160]}"


def summarize(report: Path, top: int) -> str:
    root = ET.parse(report).getroot()
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    counts = Counter()
    causes: Counter[str] = Counter()
    for suite in suites:
        for case in suite.iter("testcase"):
            children = {child.tag: child for child in case}
            if "failure" in children:
                counts["failed"] += 1
                causes[_cause(children["failure"])] += 1
            elif "error" in children:
                counts["errors"] += 1
                causes[_cause(children["error"])] += 1
            elif "skipped" in children:
                counts["skipped"] += 1
            else:
                counts["passed"] += 1
    total = sum(counts.values())
    lines = [f"conformance: {counts['passed']} passed, {counts['failed']} failed, "
             f"{counts['skipped']} skipped, {counts['errors']} errors (of {total}; "
             f"{counts['passed'] + counts['failed'] + counts['errors']} not skipped)"]
    if causes:
        lines.append(f"failures and errors by cause ({len(causes)} causes; tests, exception: "
                     f"first line of the message; the {min(top, len(causes))} largest):")
        lines += [f"  {n:5d}  {cause}" for cause, n in causes.most_common(top)]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path, help="JUnit XML report of the conformance run")
    parser.add_argument("--top", type=int, default=40, help="how many causes to list")
    args = parser.parse_args(argv[1:])
    if not args.report.exists():
        print(f"conformance: no report at {args.report} (the run did not finish)")
        return 1
    print(summarize(args.report, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
