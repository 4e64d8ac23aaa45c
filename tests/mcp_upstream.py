"""A small real MCP server (the official SDK) with four of the `support` spec's tools, for tests/test_guard_mcp.py,
and a few tools that misbehave (tests/test_guard_mcp_bounds.py): one reads the environment, one sleeps, one
answers huge, one kills the server. Run as a stdio server: `python tests/mcp_upstream.py [--junk N]` (--junk:
write N lines of garbage to stdout first, as a chatty server does).
"""

from __future__ import annotations

import os
import sys
import time

from mcp.server import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

CUSTOMERS = {"ava@example.com": "C100"}
ORDERS = {
    "O1": {"order_id": "O1", "status": "pending", "total": 40.0},
    "O2": {"order_id": "O2", "status": "shipped", "total": 15.0},
}

server = MCPServer("support-upstream")


@server.tool()
def find_customer(email: str) -> dict:
    """The customer id of an e-mail address."""
    if email not in CUSTOMERS:
        raise ToolError(f"no customer {email}")
    return {"customer_id": CUSTOMERS[email]}


@server.tool()
def list_orders(customer_id: str) -> dict:
    """A customer's orders."""
    return {"orders": sorted(ORDERS) if customer_id == "C100" else []}


@server.tool()
def get_order(order_id: str) -> dict:
    """One order."""
    if order_id not in ORDERS:
        raise ToolError(f"no order {order_id}")
    return dict(ORDERS[order_id])


@server.tool()
def cancel_order(order_id: str, reason: str) -> dict:
    """Cancel an order."""
    ORDERS[order_id]["status"] = "cancelled"
    return {"order_id": order_id, "status": "cancelled"}


@server.tool()
def read_env(name: str) -> str:
    """An environment variable of the server (how servers are configured)."""
    return os.environ.get(name, "<unset>")


@server.tool()
def nap(seconds: float) -> str:
    """Sleep, then answer."""
    time.sleep(seconds)
    return "awake"


@server.tool()
def blob(size: int) -> str:
    """A result of `size` characters."""
    return "x" * size


@server.tool()
def die(code: int) -> str:
    """End the server's process at once."""
    os._exit(code)


if __name__ == "__main__":
    if "--junk" in sys.argv:
        junk = int(sys.argv[sys.argv.index("--junk") + 1])
        sys.stdout.write("".join(f"not json-rpc line {i} \x1b[31m[bold]\n" for i in range(junk)))
        sys.stdout.flush()
    server.run()
