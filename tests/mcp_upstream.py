"""A small real MCP server (the official SDK) with four of the `support` spec's tools, for tests/test_guard_mcp.py.
Run as a stdio server: `python tests/mcp_upstream.py`."""

from __future__ import annotations

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


if __name__ == "__main__":
    server.run()
