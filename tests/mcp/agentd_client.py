"""An MCP client of agentd's `/mcp`, written with the official Python SDK.

Usage: agentd_client.py URL TOKEN. Runs one scripted exchange and prints what it saw as one
JSON object on stdout; the Rust test that starts it checks the report and the session's events.
"""

import json
import sys
import time

import anyio
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

LONG = "mcp__everything__trigger-long-running-operation"


def text_of(result):
    return "".join(getattr(block, "text", "") for block in result.content)


def method_of(message):
    return getattr(getattr(message, "root", message), "method", None)


async def main(url, token):
    report = {}
    list_changed = anyio.Event()

    async def on_message(message):
        if method_of(message) == "notifications/tools/list_changed":
            list_changed.set()

    headers = {"Authorization": f"Bearer {token}"}
    async with create_mcp_http_client(headers=headers) as http:
        async with streamable_http_client(url, http_client=http) as (read, write):
            async with ClientSession(read, write, message_handler=on_message) as session:
                init = await session.initialize()
                dumped = init.model_dump(by_alias=True, mode="json")
                report["server"] = dumped["serverInfo"]["name"]
                report["session_id"] = (dumped.get("_meta") or {}).get("agentd/session_id")

                listed = await session.list_tools()
                report["tools"] = sorted(tool.name for tool in listed.tools)
                hints = {tool.name: tool.annotations.read_only_hint for tool in listed.tools if tool.annotations}
                report["read_only"] = {name: hints.get(name) for name in ("read_file", "write_file")}

                wrote = await session.call_tool("write_file", {"path": "from-mcp.txt", "content": "hello over mcp\n"})
                report["write"] = {"is_error": wrote.is_error, "text": text_of(wrote)}
                read_back = await session.call_tool("read_file", {"path": "from-mcp.txt"})
                report["read"] = {"is_error": read_back.is_error, "text": text_of(read_back)}

                bad = await session.call_tool("read_file", {"no_such_argument": 1})
                report["bad_arguments"] = {"is_error": bad.is_error, "structured": bad.structured_content}
                try:
                    await session.call_tool("no_such_tool", {})
                    report["unknown_tool"] = "answered"
                except Exception as err:  # the SDK raises the JSON-RPC error
                    report["unknown_tool"] = str(err)

                # A deferred tool is loaded by calling it; its progress comes back as MCP's.
                steps = []

                async def on_progress(progress, total, message):
                    steps.append({"progress": progress, "total": total, "message": message})

                long = await session.call_tool(LONG, {"duration": 1, "steps": 3}, progress_callback=on_progress)
                report["long"] = {"is_error": long.is_error, "text": text_of(long), "progress": steps}
                with anyio.move_on_after(10):
                    await list_changed.wait()
                report["list_changed"] = list_changed.is_set()
                relisted = await session.list_tools()
                report["listed_after"] = LONG in {tool.name for tool in relisted.tools}

                # Abandoning a call sends notifications/cancelled; agentd stops the command.
                started = time.monotonic()
                try:
                    await session.call_tool("shell", {"command": "sleep 30"}, read_timeout_seconds=1.0)
                    report["cancelled"] = "answered"
                except Exception as err:
                    report["cancelled"] = type(err).__name__
                report["cancel_seconds"] = time.monotonic() - started

                # A spawn_only tool answers with the task envelope; read_task_output is a tool.
                spawned = await session.call_tool("glob", {"pattern": "*.txt"})
                envelope = json.loads(text_of(spawned))
                report["envelope"] = envelope
                report["envelope_structured"] = spawned.structured_content
                handle = envelope.get("task_handle")
                output = ""
                deadline = time.monotonic() + 20
                while handle and "from-mcp.txt" not in output and time.monotonic() < deadline:
                    read_out = await session.call_tool("read_task_output", {"task_handle": handle})
                    output = text_of(read_out)
                    if "from-mcp.txt" not in output:
                        await anyio.sleep(0.05)
                report["task_output"] = output
    print(json.dumps(report))


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], sys.argv[2])
