"""The pihost_client tour: one example, run unchanged under asyncio or trio.

    python tour.py --data-dir /tmp/pi-tour [--backend asyncio|trio]

Safe to run again and again: every run makes its own session and the client
generates a fresh submissionId for every mutating call.
"""

from __future__ import annotations

import argparse
import uuid

import anyio

from pihost_client import Event, RpcError, connect


async def tour(data_dir: str) -> None:
    async with connect(data_dir=data_dir, client_id="tour-example", client_kind="ui") as client:
        session = await client.session.create(title="Tour", project_path="/tmp/pi-tour-project")
        sid = session["id"]
        async with client.subscribe(["session.message"], session_id=sid) as events:
            for i in range(3):
                appended = await client.session.append_message(session_id=sid, message={
                    "id": f"m{i}-{uuid.uuid4().hex[:8]}", "role": "user",
                    "blocks": [{"type": "text", "text": f"hello {i} — 数据库"}]})
                print("appended seq", appended["message"]["seq"])
            seen = []
            with anyio.fail_after(10):
                async for item in events:
                    if isinstance(item, Event):
                        seen.append(item.data["message"]["seq"])
                        if len(seen) == 3:
                            break
            print("events seq", seen)
        page = await client.session.get(session_id=sid, message_limit=2)
        print("window", page["messageStart"], page["hasMoreBefore"], [m["blocks"][0]["text"] for m in page["messages"]])
        hits = await client.search.sessions(query="数据库", limit=50)
        print("search finds this session", any(r["sessionId"] == sid for r in hits["results"]))
        try:
            await client.session.get(session_id="no-such-session")
        except RpcError as exc:
            print("error code", exc.data_code)
        status = await client.host.status()
        print("host version", status["version"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    args = ap.parse_args()
    anyio.run(tour, args.data_dir, backend=args.backend)
    print("tour ok on", args.backend)


if __name__ == "__main__":
    main()
