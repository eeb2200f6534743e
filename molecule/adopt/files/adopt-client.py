#!/usr/bin/env python3
"""A client that keeps asking the server while the adoption switches it (molecule adopt).

``adopt-client.py URL MODEL LOG STOPFILE``: one small chat request every 0.2 s (each with a
5 s timeout) until STOPFILE exists; every answer or error is a JSON line in LOG. At the end
it appends a summary line: the longest time between two consecutive answers (the switch's
gap, an upper bound of "last answer of the old server to first answer of the new"), and
the counts.
"""

import json
import os
import sys
import time
import urllib.request


def ask(url: str, model: str) -> bool:
    """One chat request; whether it was answered with a completion."""
    body = json.dumps(
        {"model": model, "messages": [{"role": "user", "content": "def add(a, b):"}], "max_tokens": 2, "temperature": 0}
    ).encode()
    request = urllib.request.Request(
        url + "/v1/chat/completions", data=body, headers={"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            return answer.status == 200 and "choices" in json.loads(answer.read())
    except Exception:  # noqa: BLE001 - every failure is just "no answer" here
        return False


def main() -> int:
    """Loop, log, summarise."""
    url, model, log, stop = sys.argv[1:5]
    answers, errors = [], 0
    with open(log, "a", encoding="utf-8") as out:
        while not os.path.exists(stop):
            sent = time.time()
            ok = ask(url, model)
            done = time.time()
            out.write(json.dumps({"sent": round(sent, 3), "done": round(done, 3), "ok": ok}) + "\n")
            out.flush()
            if ok:
                answers.append(done)
            else:
                errors += 1
            time.sleep(max(0.0, 0.2 - (time.time() - sent)))
        gaps = [(b - a, a, b) for a, b in zip(answers, answers[1:])]  # noqa: B905 - the test host's python3 may predate 3.10 (no strict=)
        gap, last_old, first_new = max(gaps) if gaps else (None, None, None)
        out.write(
            json.dumps(
                {
                    "summary": True,
                    "answers": len(answers),
                    "errors": errors,
                    "gap_s": round(gap, 3) if gap is not None else None,
                    "last_answer_before_gap": last_old,
                    "first_answer_after_gap": first_new,
                }
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
