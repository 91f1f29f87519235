"""The notification sender's achieved rate against the configured one.

Starts an SMTP server in this process (aiosmtpd on 127.0.0.1, counting each
message's arrival) and one real node (``crewletd start``, embedded broker,
its ``smtp:`` pointed at that server), then for each configured rate (1, 10
and 100 a second, burst 1, applied as company revisions):

* **crewlet**: puts ``rate·seconds + 1`` notifications on ``OUTBOX`` at once
  and measures, at the SMTP server, the achieved rate (arrivals − 1 over
  first to last arrival) and the worst window: the most any window of
  length L held beyond ``burst + rate·L`` (target 0), for the arrivals and
  for the valve's admissions (each record's ``admitted``);
* **bare**: the same number of emails from a bare aiosmtplib loop to the
  same server, paced at the same rate by the clock (send i at t0 + i/rate),
  measured the same way;

and once, the bare loop unpaced for a few seconds: what one SMTP connection
carries here (the ceiling). Ratios are crewlet/configured and crewlet/bare.

    python bench/sender.py [--seconds 60] [--rates 1,10,100] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

import aiosmtplib
import nats

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import add_smoke, BenchError, Crewletd, emit, ratio, say  # noqa: E402
from crewlet import outbox  # noqa: E402
from crewlet.mailer import message  # noqa: E402
from tests.smtp import SmtpServer, worst_window  # noqa: E402

CEILING_SECONDS = 3.0
SETTLE = 2.0  # s after a company revision is applied before its round
BURST = 1


def company(path: str, rate: float) -> str:
    with open(path, "w") as f:
        f.write("company: {name: bench}\nproviders: {p: {kind: scripted}}\n"
                "seats: [{name: s00, persona: one, provider: p}]\n"
                f"notify: {{rate: {rate}, burst: {BURST}}}\n")
    return path


def ctl(node: Crewletd, *args: str) -> None:
    exe = os.path.join(os.path.dirname(sys.executable), "crewletctl")
    out = subprocess.run([exe, "-c", node.config_path, *args], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise BenchError(f"crewletctl {' '.join(args)}: {out.stderr.strip()}")


def figures(times: list[float], rate: float) -> dict[str, Any]:
    times = sorted(times)
    span = times[-1] - times[0] if len(times) > 1 else 0.0
    return {"n": len(times), "achieved": (len(times) - 1) / span if span > 0 else None,
            "worst_window": round(worst_window(times, rate, BURST), 3)}


async def wait_arrivals(smtpd: SmtpServer, prefix: str, n: int, timeout: float) -> list[float]:
    deadline = time.monotonic() + timeout
    while True:
        with smtpd.lock:
            times = [t for i, t in smtpd.arrivals if i.startswith(prefix)]
        if len(times) >= n:
            return times
        if time.monotonic() > deadline:
            raise BenchError(f"only {len(times)} of {n} {prefix} emails arrived in {timeout:g}s")
        await asyncio.sleep(0.1)


async def crewlet_round(node: Crewletd, smtpd: SmtpServer, rate: float, n: int, base: str,
                        settle: float = SETTLE) -> dict[str, Any]:
    ctl(node, "apply", company(os.path.join(base, f"company-{rate:g}.yaml"), rate))
    await asyncio.sleep(settle)  # every child has the revision (the sender reads the rate per send)
    prefix = f"crewlet-{rate:g}-"
    nc = await nats.connect(node.url)
    js = nc.jetstream()
    for i in range(n):
        await outbox.put(js, outbox.Notification(id=f"{prefix}{i:05d}", to=["ops@example.com"],
                                                 subject=f"bench {i}", body="x"))
    times = await wait_arrivals(smtpd, prefix, n, n / rate * 2 + 60)
    admitted = [r["admitted"] for r in await outbox.outcomes(js, limit=10 * n)
                if r["id"].startswith(prefix) and r.get("admitted")]
    await nc.close()
    out = figures(times, rate)
    out["admissions_worst_window"] = round(worst_window(sorted(admitted), rate, BURST), 3)
    return out


async def bare_round(smtpd: SmtpServer, rate: float | None, n: int | None, seconds: float = 0.0,
                     prefix: str = "bare-") -> dict[str, Any]:
    """A bare aiosmtplib loop on one connection: *n* emails paced at *rate*,
    or (rate None) as fast as it goes for *seconds*."""
    smtp = aiosmtplib.SMTP(hostname="127.0.0.1", port=smtpd.port, start_tls=False)
    await smtp.connect()
    t0, i = time.time(), 0
    while (i < n) if n is not None else (time.time() - t0 < seconds):
        if rate is not None:
            await asyncio.sleep(max(0.0, t0 + i / rate - time.time()))
        note = outbox.Notification(id=f"{prefix}{i:06d}", to=["ops@example.com"], subject="b", body="x")
        await smtp.sendmail("bench@localhost", note.to, message(note, "bench@localhost"))
        i += 1
    await smtp.quit()
    with smtpd.lock:
        times = [t for id, t in smtpd.arrivals if id.startswith(prefix)]
    return figures(times, rate) if rate is not None else {"n": len(times), "achieved": len(times) / seconds}


async def run_all(args: argparse.Namespace) -> dict[str, Any]:
    rates = [float(r) for r in args.rates.split(",")]
    smtpd = SmtpServer().start()
    base = tempfile.mkdtemp(prefix="cwsend", dir="/tmp")
    node = Crewletd(base, {"node": {"id": "bench"},
                           "fleet": {"heartbeat": 1, "lease_ttl": 3, "sweep": 0.5},
                           "smtp": {"host": "127.0.0.1", "port": smtpd.port, "tls": "none",
                                    "retry_after": 1}})
    report: dict[str, Any] = {"seconds": args.seconds, "burst": BURST, "rates": {}}
    try:
        node.start("--company", company(os.path.join(base, "company.yaml"), rates[0]))
        deadline = time.monotonic() + 60
        while not any(d.get("name") == "sender" for d in ((node.status() or {}).get("fleet") or {})
                      .get("duties", [])):
            node.check_alive()
            if time.monotonic() > deadline:
                raise BenchError("no sender duty after 60 s")
            await asyncio.sleep(0.2)
        report["ceiling"] = await bare_round(smtpd, None, None, args.ceiling, prefix="ceiling-")
        say(f"bare ceiling: {report['ceiling']['achieved']:.0f} emails/s")
        for rate in rates:
            n = int(rate * args.seconds) + 1
            say(f"rate {rate:g}/s: {n} notifications through crewlet …")
            mine = await crewlet_round(node, smtpd, rate, n, base, args.settle)
            say(f"rate {rate:g}/s: {n} emails from a bare paced loop …")
            bare = await bare_round(smtpd, rate, n, prefix=f"bare-{rate:g}-")
            report["rates"][f"{rate:g}"] = {
                "crewlet": mine, "bare": bare,
                "crewlet_vs_configured": ratio(mine["achieved"], rate),
                "crewlet_vs_bare": ratio(mine["achieved"], bare["achieved"])}
        report["node_problems"] = node.problems()
    finally:
        node.stop()
        smtpd.stop()
    shutil.rmtree(base, ignore_errors=True)  # a failed run keeps it: the node's log
    return report


def print_text(r: dict[str, Any]) -> None:
    print(f"sender: {r['seconds']:g} s per rate, burst {r['burst']}; bare aiosmtplib ceiling "
          f"{r['ceiling']['achieved']:.0f} emails/s on one connection")
    print(f"{'rate':>6} {'crewlet':>10} {'bare':>10} {'vs rate':>8} {'vs bare':>8} "
          f"{'worst window (arrivals/admissions/bare)':>42}")
    for rate, x in r["rates"].items():
        c, b = x["crewlet"], x["bare"]
        print(f"{rate:>6} {c['achieved']:>10.3f} {b['achieved']:>10.3f} {x['crewlet_vs_configured']:>8.3f} "
              f"{x['crewlet_vs_bare']:>8.3f} {c['worst_window']:>+14.2f} {c['admissions_worst_window']:>+12.2f} "
              f"{b['worst_window']:>+12.2f}")
    if r.get("node_problems"):
        print(f"node warnings: {r['node_problems']}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=60.0, help="seconds of sending per rate (default 60)")
    p.add_argument("--rates", default="1,10,100", help="configured rates, emails a second")
    p.add_argument("--ceiling", type=float, default=CEILING_SECONDS,
                   help=f"seconds of the unpaced bare loop (default {CEILING_SECONDS:g})")
    p.add_argument("--json", action="store_true")
    p.add_argument("--settle", type=float, default=SETTLE,
                   help=f"seconds after a rate's revision is applied before its round (default {SETTLE:g})")
    add_smoke(p, None, {"seconds": 0.5, "rates": "10", "ceiling": 0.3, "settle": 0.5})
    args = p.parse_args()
    # SIGTERM ends the run through the finally blocks (the servers and nodes it started stop), like Ctrl-C.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        report = asyncio.run(run_all(args))
    except BenchError as exc:
        say(f"failed: {exc}")
        return 1
    return emit(report, args.json, print_text)


if __name__ == "__main__":
    sys.exit(main())
