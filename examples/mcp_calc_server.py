"""A calculator as an MCP server, built on the official SDK (``pip install mcp``): the kind of
tool server people already have, plugged into a task unchanged by ``examples/mcp_tools.py``.

    python examples/mcp_calc_server.py            # over stdio (what mcp_tools.py starts)
    python examples/mcp_calc_server.py 8000       # over streamable HTTP at http://127.0.0.1:8000/mcp
"""

from __future__ import annotations

import sys

from mcp.server.mcpserver import MCPServer

server = MCPServer("calc")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


if __name__ == "__main__":
    if len(sys.argv) > 1:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[1]), stateless_http=True)
    else:
        server.run("stdio")
