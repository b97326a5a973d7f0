#!/usr/bin/env python3
"""Run the config corpus (tests/configs/) against gannet and Debian's nginx and print, per
config, pass/fail (with the differing requests with -v), then the overall pass rate: configs
fully passing / total and requests matching / total.

    scripts/config-corpus.py [-v] [NAME...]     (GANNET_BIN picks the binary, as in the e2e tests)
"""

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "e2e"))

from corpus_lib import Services, config_names, known_gaps, run_config  # noqa: E402


def main() -> int:
    args = sys.argv[1:]
    verbose = "-v" in args
    names = [a for a in args if a != "-v"] or config_names()
    gaps = known_gaps()
    passed = matched = total = 0
    with tempfile.TemporaryDirectory(prefix="corpus-") as tmp:
        svc = Services(Path(tmp) / "services")
        try:
            for name in names:
                res = run_config(name, Path(tmp) / name, svc)
                n = len(res.rows)
                passed += res.passed
                matched += res.matched
                total += n
                state = "pass" if res.passed else ("FAIL (cannot load)" if not res.loaded else "FAIL")
                known = f"  [known gap: {gaps[name]}]" if name in gaps else ""
                print(f"{name:28} {state:20} {res.matched}/{n} requests{known}")
                if verbose and not res.passed:
                    print("    " + res.report().replace("\n", "\n    "))
        finally:
            svc.close()
    print(f"\nconfigs fully passing: {passed}/{len(names)} ({100 * passed / max(len(names), 1):.0f}%)")
    print(f"requests matching:     {matched}/{total} ({100 * matched / max(total, 1):.0f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
