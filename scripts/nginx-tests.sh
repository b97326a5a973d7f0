#!/usr/bin/env bash
# nginx's own functional test suite (github.com/nginx/nginx-tests) as gannet's yardstick:
# runs the suite against Debian's nginx and against gannet with the same module selection
# and prints per-file and total results side by side.
#
#   scripts/nginx-tests.sh [-o DIR] CHECKOUT [FILE.t ...]
#
# CHECKOUT is a clone of nginx-tests (it is never copied into this repository); FILEs are
# test files relative to it (default: all *.t). Environment: GANNET_BIN (default
# target/release/gannet), NGINX_BIN (default /usr/sbin/nginx), TIMEOUT (seconds per file,
# default 60), JOBS (prove -j, default 2), SERVERS (default "nginx gannet": the servers to
# run; with -o, a server left out keeps its results from an earlier run in DIR, so the two
# can run in parallel and be tabulated together). -o keeps the TAP output and the tables in DIR.
# SERVERS may also name `mainline`: an nginx built from source at the release the suite
# follows (MAINLINE_BIN; see docs/testing.md), run only to time the files Debian's nginx
# cannot start (a newer directive): gannet's time on those is then held to twice its.
#
# Module selection: nginx-tests reads `BINARY -V` to skip the tests of modules a binary lacks.
# Debian's nginx is given through a wrapper that answers `-V` with gannet's list (gannet
# prints nginx's layout, see docs/running.md), so both servers run exactly the same tests;
# Debian's own list also names dynamic modules it does not ship; its stream and mail
# modules (libnginx-mod-stream, libnginx-mod-mail) are loaded for nginx's run.
# As root the suite runs as `nobody`, as nginx-tests expects an unprivileged user (a root
# nginx's workers become `nobody` and cannot read the suite's private temp dirs).
# Each file runs under `timeout` (its whole process group: the test, its server, its
# backends), so a hang costs TIMEOUT seconds and is reported, never stalls the run.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"

out=""
if [ "${1:-}" = "-o" ]; then out="$2"; shift 2; fi
if [ $# -lt 1 ] || [ ! -f "$1/lib/Test/Nginx.pm" ]; then
  echo "usage: $0 [-o DIR] NGINX-TESTS-CHECKOUT [FILE.t ...]" >&2
  exit 2
fi
suite="$(cd "$1" && pwd)"
shift
gannet="$(realpath "${GANNET_BIN:-$repo/target/release/gannet}")"
nginx="${NGINX_BIN:-/usr/sbin/nginx}"
timeout="${TIMEOUT:-60}"
jobs="${JOBS:-2}"
[ -x "$gannet" ] || { echo "no gannet binary at $gannet (cargo build --release)" >&2; exit 2; }
[ -x "$nginx" ] || { echo "no nginx binary at $nginx" >&2; exit 2; }

if [ -n "$out" ]; then
  mkdir -p "$out" && work="$(cd "$out" && pwd)"
else
  work="$(mktemp -d /tmp/nginx-tests-run.XXXXXX)"
  trap 'rm -rf "$work"' EXIT
fi
chmod 755 "$work"

# Debian's nginx, answering -V as gannet does (nginx's own version line).
cat >"$work/debian-nginx" <<EOF
#!/bin/sh
if [ "\$1" = "-V" ]; then "$gannet" -V 2>&1 | sed 's/ (gannet[^)]*)//' >&2; exit 0; fi
exec "$nginx" "\$@"
EOF
# One test file: under timeout, in its own TMPDIR so its leftover test dirs can be searched
# for crashes (a panic, a process killed by a signal) and removed; TAP copied for the tables.
cat >"$work/run-one" <<'EOF'
#!/usr/bin/env bash
t="$1"; name="$(basename "$t" .t)"
tmp="$(mktemp -d)"
start=$(date +%s%N)
TMPDIR="$tmp" TEST_NGINX_LEAVE=1 timeout -k 10 "$TIMEOUT" perl "$t" >"$RESULTS/$name.tap" 2>"$RESULTS/$name.err"
rc=$?
echo $(( ($(date +%s%N) - start) / 1000000 )) >"$RESULTS/$name.ms"
cat "$RESULTS/$name.tap"
[ $rc -eq 124 ] || [ $rc -eq 137 ] && echo hang >"$RESULTS/$name.status"
# A server that would not start under try_run() (the test is then skipped, with stderr
# closed): its error log says why.
grep -sh '\[emerg\]' "$tmp"/*/error.log | head -n 1 >>"$RESULTS/$name.err"
if grep -sqE 'panicked|exited on signal' "$tmp"/*/error.log; then
  echo crash >>"$RESULTS/$name.status"
fi
rm -rf "$tmp"
exit $rc
EOF
chmod 755 "$work/debian-nginx" "$work/run-one"

if [ $# -gt 0 ]; then files=("$@"); else
  mapfile -t files < <(cd "$suite" && ls -- *.t)
fi

as_user=()
if [ "$(id -u)" -eq 0 ]; then as_user=(runuser -u nobody --); fi

for server in ${SERVERS-nginx gannet}; do
  rm -rf "${work:?}/$server"
  bin="$work/debian-nginx"; [ $server = gannet ] && bin="$gannet"
  [ $server = mainline ] && bin="$(realpath "${MAINLINE_BIN:?MAINLINE_BIN: an nginx built from source}")"
  # Debian builds stream, mail and image_filter as dynamic modules: loaded for nginx's run (the suite
  # puts TEST_NGINX_GLOBALS in every config's main context); gannet has them built in.
  globals=""
  for so in /usr/lib/nginx/modules/ngx_stream_module.so /usr/lib/nginx/modules/ngx_mail_module.so \
    /usr/lib/nginx/modules/ngx_http_image_filter_module.so; do
    if [ $server = nginx ] && [ -f $so ]; then globals="$globals load_module $so;"; fi
  done
  mkdir -p "$work/$server"; chmod 777 "$work/$server"
  echo "==> $server: ${#files[@]} files, prove -j$jobs, ${timeout}s per file" >&2
  (cd "$suite" && "${as_user[@]}" env TEST_NGINX_BINARY="$bin" TEST_NGINX_GLOBALS="$globals" TIMEOUT="$timeout" \
    RESULTS="$work/$server" PERL5LIB="$suite/lib" \
    prove -j"$jobs" --exec "$work/run-one" "${files[@]}" >"$work/$server.prove" 2>&1) || true
  tail -n 3 "$work/$server.prove" >&2
done

python3 - "$work" "${files[@]}" <<'EOF'
import re, sys
from pathlib import Path

work, files = Path(sys.argv[1]), sys.argv[2:]

def result(server, f):
    """(passed, failed, skipped, status) of one file's TAP."""
    name = Path(f).stem
    tap = (work / server / f"{name}.tap")
    text = tap.read_text(errors="replace") if tap.exists() else ""
    st = work / server / f"{name}.status"
    status = ",".join(sorted(set(st.read_text().split()))) if st.exists() else ""
    m = re.search(r"^1\.\.(\d+)(.*)$", text, re.M)
    planned = int(m.group(1)) if m else 0
    skipped = m and planned == 0
    ok = fail = skip = 0
    for line in text.splitlines():
        if re.match(r"^(not )?ok\b", line):
            if "# skip" in line.lower():
                skip += 1
            elif line.startswith("ok") or "# TODO" in line:
                ok += 1
            else:
                fail += 1
    # Planned but never run (the script died): failures.
    fail += max(0, planned - ok - fail - skip)
    if skipped:
        status = "skip: " + m.group(2).replace("# SKIP", "").strip()
    elif not m and not status:
        status = "no plan"
    # Why a server did not start ("Can't start nginx"): its first [emerg], without the
    # config's path.
    err = work / server / f"{name}.err"
    errs = err.read_text(errors="replace") if err.exists() else ""
    emerg = re.search(r"\[emerg\] (.*)", errs)
    if emerg and (fail and "Can't start nginx" in errs or planned == 0 or not m):
        status = (status + " " if status else "") + "emerg: " + re.sub(r"^(\d+#\d+: )?\S+:\d+: | in \S+:\d+$", "", emerg.group(1))
    return ok, fail, skip, status

rows, tot = [], {s: [0, 0, 0, 0, 0, 0] for s in ("nginx", "gannet")}
causes = {s: {} for s in ("nginx", "gannet")}
slow = []
for f in files:
    row = [f]
    res = {s: result(s, f) for s in ("nginx", "gannet")}
    for s, other in (("nginx", "gannet"), ("gannet", "nginx")):
        ok, fail, skip, status = res[s]
        # Nothing run (a try_run() skip: the server did not start; or the test died before
        # its plan) where the other server ran the file: what the other ran is lost.
        if not ok + fail + skip and sum(res[other][:3]):
            fail = sum(res[other][:3])
            status = status.replace("skip: ", "skipped: ")
        t = tot[s]
        if status.startswith("skip:"):
            t[4] += 1
        else:
            t[0] += 1
        t[1] += ok; t[2] += fail; t[3] += skip
        t[5] += ("hang" in status) + ("crash" in status)
        row.append(f"{ok}/{fail}/{skip} {status}".strip())
        if fail:
            # Subtests lost, by cause: the config error that stopped the server, a hang,
            # or wrong answers (the file's own failures).
            e = re.search(r"emerg: (.*)", status)
            cause = e.group(1) if e else "hang" if "hang" in status else "wrong answers"
            cause = re.sub(r"/tmp/\S+", "PATH", cause)
            n, fs = causes[s].get(cause, (0, []))
            causes[s][cause] = (n + fail, fs + [f])
    # Time: a file gannet takes more than twice nginx's time over (and more than a second
    # longer, below which it is start-up noise) is listed. Where nginx did not start the
    # file's config (a newer nginx's directive) its time is no reference: gannet's is listed
    # over 10 s, as slow as a file that waits on timeouts.
    # With a mainline nginx's run (SERVERS=mainline), its time is the reference there.
    ms = {s: (work / s / f"{Path(f).stem}.ms") for s in ("nginx", "gannet", "mainline")}
    if ms["nginx"].exists() and ms["gannet"].exists() and sum(res["gannet"][:3]):
        tn, tg = (int(ms[s].read_text() or 0) for s in ("nginx", "gannet"))
        if "emerg:" in res["nginx"][3] or not sum(res["nginx"][:3]):
            main = result("mainline", f) if ms["mainline"].exists() else (0, 0, 0, "")
            if sum(main[:3]) and "emerg:" not in main[3]:
                tm = int(ms["mainline"].read_text() or 0)
                if tg > 2 * tm and tg - tm > 1000:
                    slow.append(f"{f} {tg / 1000:.1f} s (nginx mainline {tm / 1000:.1f} s)")
            elif tg > 10000:
                slow.append(f"{f} {tg / 1000:.1f} s (nginx 1.22 cannot run it)")
        elif tg > 2 * tn and tg - tn > 1000:
            slow.append(f"{f} {tg / 1000:.1f} s (nginx {tn / 1000:.1f} s)")
    rows.append(row)

out = ["file\tnginx pass/fail/skip\tgannet pass/fail/skip"]
out += ["\t".join(r) for r in rows]
(work / "table.tsv").write_text("\n".join(out) + "\n")
w = max(len(f) for f in files) if files else 4
print(f"{'file':<{w}}  {'nginx pass/fail/skip':<34}  gannet pass/fail/skip")
for r in rows:
    print(f"{r[0]:<{w}}  {r[1][:34]:<34}  {r[2]}")
print()
print(f"{'':<16}{'files run':>10}{'skipped':>9}{'passed':>9}{'failed':>9}{'sub-skip':>9}{'hang/crash':>11}")
for s in ("nginx", "gannet"):
    run, ok, fail, skip, skipped, hc = tot[s]
    print(f"{s:<16}{run:>10}{skipped:>9}{ok:>9}{fail:>9}{skip:>9}{hc:>11}")
lines = []
for s in ("nginx", "gannet"):
    lines.append(f"\n{s}: subtests lost, by cause")
    for cause, (n, fs) in sorted(causes[s].items(), key=lambda c: -c[1][0]):
        lines.append(f"{n:>6}  {cause}  ({len(fs)} files: {' '.join(fs[:8])}{' ...' if len(fs) > 8 else ''})")
lines.append(f"\nslow files (over twice nginx's time): {len(slow)}")
lines += [f"  {x}" for x in slow]
(work / "causes.txt").write_text("\n".join(lines) + "\n")
print(f"\nslow files (over twice nginx's time): {len(slow)}")
for x in slow:
    print(f"  {x}")
# The same as markdown, for docs/testing.md's results (-o keeps it as results.md).
def passed(cell):
    return int(cell.split("/", 1)[0])
kept = sum(min(passed(r[1]), passed(r[2])) for r in rows)
md = ["| server | files run | subtests passed | failed or lost | skipped | hangs or crashes |",
      "|---|---|---|---|---|---|"]
for s, label in (("nginx", "Debian's nginx"), ("gannet", "gannet")):
    run, ok, fail, skip, skipped, hc = tot[s]
    md.append(f"| {label} | {run} | {ok:,} | {fail:,} | {skip} | {hc} |")
if tot["nginx"][1]:
    md += ["", f"Per file, gannet passes at least what nginx passes for {100 * kept / tot['nginx'][1]:.1f}% of "
           f"nginx's passed subtests ({kept:,} of {tot['nginx'][1]:,})."]
md += ["", f"Slow files (gannet over twice nginx's time and a second more; where Debian's nginx cannot "
       f"start the config, twice a mainline nginx's time if one was run, else over 10 s): {len(slow)}"
       + (":" if slow else ".")]
md += [f"- {x}" for x in slow]
md += ["", "gannet's causes of lost subtests:", "", "| lost | cause | files |", "|---|---|---|"]
for cause, (n, fs) in sorted(causes["gannet"].items(), key=lambda c: -c[1][0]):
    md.append(f"| {n} | {cause} | {len(fs)} files: {' '.join(fs[:12])}{' ...' if len(fs) > 12 else ''} |")
md += ["", "Per file (files run by either server; `pass/fail/skip`, fail including lost subtests):", "",
       "| file | nginx pass/fail/skip | gannet pass/fail/skip |", "|---|---|---|"]
md += [f"| {r[0]} | {r[1]} | {r[2]} |" for r in rows if not (r[1].startswith("0/0/0 skip:") and r[2].startswith("0/0/0 skip:"))]
skipped_both = {}
for r in rows:
    if r[1].startswith("0/0/0 skip:") and r[2].startswith("0/0/0 skip:"):
        why = re.sub(r" emerg: .*", "", r[2][len("0/0/0 skip: "):])
        skipped_both.setdefault(why, []).append(Path(r[0]).stem)
md += ["", "Skipped by both (the module is not built in, or the test's prerequisites):", ""]
md += [f"- {why} ({len(fs)}): {', '.join(fs)}" for why, fs in sorted(skipped_both.items(), key=lambda c: -len(c[1]))]
(work / "results.md").write_text("\n".join(md) + "\n")
for s in ("nginx", "gannet"):
    print(f"\n{s}: top causes by subtests lost (all of them in causes.txt, kept with -o)")
    for cause, (n, fs) in sorted(causes[s].items(), key=lambda c: -c[1][0])[:10]:
        print(f"{n:>6}  {cause}  ({len(fs)} files)")
EOF
[ -z "$out" ] || echo "results in $out (table.tsv, SERVER/FILE.tap)" >&2
