"""Conversions run by the web instance itself against conversions handed to a worker.

    .venv/bin/python bench/bench_workers.py [--rounds 3] [--documents 6]
    DATABASE_URL=postgresql+psycopg://... .venv/bin/python bench/bench_workers.py

Two set-ups on one temporary data dir and database, single-user, alternating round by
round so that both meet the same machine load:

- **embedded**: one `make run`-style instance (tests/support/live_server.py) with the
  default `jobs.run_in_web: true`; it converts what it is asked to.
- **apart**: the same instance with `jobs.run_in_web: false`, and one `flask --app app
  worker` process (tests/support/live_worker.py) that claims the queued jobs
  (`jobs.poll_seconds`: the default, 1 s).

Each round uploads `--documents` small Word files into a fresh thread, asks for all their
conversions at once, and polls the listing every 50 ms. Figures: the median time from a
convert request to its companion being listed, the whole batch's time, and the median
list latency on the web instance while the conversions run; each as a ratio apart /
embedded taken within the round. On one machine the worker shares the web instance's CPU
cores, so the handover's cost (the poll, the database round trips) is what shows; the gain
of separate machines (a web instance whose cores no converter takes) cannot show here.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.documents import make_docx  # noqa: E402
from tests.support.live_server import LiveServer  # noqa: E402
from tests.support.live_worker import LiveWorker  # noqa: E402

POLL = 0.05


def run_batch(url: str, thread_id: str, documents: list[Path]) -> dict[str, float]:
    """Upload, convert all at once, poll until every companion is listed; the figures."""
    for document in documents:
        answer = requests.post(
            f"{url}/api/threads/{thread_id}/uploads",
            files={"files": (document.name, document.read_bytes())},
            timeout=60,
        )
        answer.raise_for_status()
    asked: dict[str, float] = {}
    started = time.perf_counter()
    with ThreadPoolExecutor(len(documents)) as pool:

        def convert(name: str) -> None:
            asked[name] = time.perf_counter()
            answer = requests.post(
                f"{url}/api/threads/{thread_id}/uploads/{name}/convert", timeout=120
            )
            assert answer.status_code in (200, 202), answer.text

        list(pool.map(convert, [d.name for d in documents]))
    done: dict[str, float] = {}
    lists: list[float] = []
    deadline = time.monotonic() + 600
    while len(done) < len(documents):
        assert time.monotonic() < deadline, "the conversions did not finish in 10 minutes"
        before = time.perf_counter()
        answer = requests.get(f"{url}/api/threads/{thread_id}/uploads/list", timeout=60)
        now = time.perf_counter()
        lists.append(now - before)
        for entry in answer.json()["files"]:
            state = entry.get("conversion_state")
            assert state != "failed", entry
            if state == "done" and entry["filename"] not in done:
                done[entry["filename"]] = now
        time.sleep(POLL)
    return {
        "latency": statistics.median(done[name] - asked[name] for name in done),
        "batch": max(done.values()) - started,
        "list": statistics.median(lists),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--documents", type=int, default=6)
    args = parser.parse_args()
    database_url = os.environ.get("DATABASE_URL")
    root = Path(tempfile.mkdtemp(prefix="bench-workers-"))
    try:
        base_dir = root / "data"
        base_dir.mkdir()
        made = root / "made"
        made.mkdir()
        documents = [
            make_docx(made / f"doc{n}.docx", title=f"Report {n}", filler_paragraphs=200)
            for n in range(args.documents)
        ]
        configs = {}
        for name, run_in_web in (("embedded", True), ("apart", False)):
            configs[name] = root / f"{name}.yaml"
            configs[name].write_text(
                yaml.safe_dump(
                    {
                        "uploads": {"conversion_wait_seconds": 0.1},
                        "jobs": {"run_in_web": run_in_web},
                    }
                )
            )
        env = {"DEER_FLOW_AUTH_DISABLED": "1"}
        print(f"database: {database_url or 'SQLite in the data dir'}; {args.documents} docx/round")
        figures: dict[str, list[dict[str, float]]] = {"embedded": [], "apart": []}
        for round_number in range(args.rounds):
            for name in ("embedded", "apart"):
                server = LiveServer(
                    base_dir,
                    config=configs[name],
                    single_user=True,
                    database_url=database_url,
                    workers=2,
                    env=env,
                    log=root / f"{name}-web.log",
                )
                worker = None
                server.start()
                try:
                    if name == "apart":
                        worker = LiveWorker(
                            base_dir,
                            root / "worker.log",
                            config=configs[name],
                            database_url=database_url,
                            env=env,
                        ).start()
                    figures[name].append(run_batch(server.url, f"{name}-{round_number}", documents))
                finally:
                    if worker is not None:
                        worker.stop()
                    server.stop()
            print(
                f"round {round_number + 1}: "
                + ", ".join(
                    f"{name} latency {figures[name][-1]['latency']:.2f} s "
                    f"batch {figures[name][-1]['batch']:.2f} s "
                    f"list {figures[name][-1]['list'] * 1000:.1f} ms"
                    for name in ("embedded", "apart")
                )
            )
        print()
        print(f"{'figure':<34}{'embedded':>12}{'apart':>12}{'apart/embedded':>16}")
        for key, label, unit, scale in (
            ("latency", "convert -> listed (median)", "s", 1),
            ("batch", f"{args.documents} documents, whole batch", "s", 1),
            ("list", "list while converting (median)", "ms", 1000),
        ):
            embedded = statistics.median(f[key] for f in figures["embedded"]) * scale
            apart = statistics.median(f[key] for f in figures["apart"]) * scale
            ratios = [
                a[key] / e[key] for a, e in zip(figures["apart"], figures["embedded"], strict=True)
            ]
            print(
                f"{label:<34}{embedded:>10.2f} {unit:<1}{apart:>10.2f} {unit:<1}"
                f"{statistics.median(ratios):>15.2f}x"
            )
        return 0
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
