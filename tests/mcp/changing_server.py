"""A stdio MCP server, written with the official Python SDK, whose tool list changes on request.

`add_tool NAME` registers a tool NAME and sends `notifications/tools/list_changed`;
`remove_tool NAME` takes it away again. `wait_for_cancel` waits until the client cancels it and
then writes `cancelled.txt` in the working directory, so a test can see that the client sent
`notifications/cancelled`. `connect PORT` tries TCP to 127.0.0.1:PORT, to show the sandbox's
network rule.
"""

import pathlib
import socket

import anyio
from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("changing")


@server.tool()
async def add_tool(name: str, ctx: Context) -> str:
    """Adds a tool called NAME that says its name."""

    def say_name() -> str:
        return f"I am {name}"

    server.add_tool(say_name, name=name, description=f"Says that it is {name}.")
    await ctx.session.send_tool_list_changed()
    return f"added {name}"


@server.tool()
async def remove_tool(name: str, ctx: Context) -> str:
    """Removes the tool called NAME."""
    server.remove_tool(name)
    await ctx.session.send_tool_list_changed()
    return f"removed {name}"


@server.tool()
def connect(port: int) -> str:
    """Tries a TCP connection to 127.0.0.1:PORT from inside the sandbox."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            return "connected"
    except OSError as err:
        return f"refused: {err}"


@server.tool()
async def wait_for_cancel() -> str:
    """Waits until the call is cancelled, then leaves cancelled.txt behind."""
    try:
        await anyio.sleep(300)
    except anyio.get_cancelled_exc_class():
        pathlib.Path("cancelled.txt").write_text("cancelled\n")
        raise
    return "never cancelled"


if __name__ == "__main__":
    server.run()
