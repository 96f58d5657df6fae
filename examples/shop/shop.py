"""A small shop, written from scratch as an example of your own tools: inventory, a cart, orders and refunds.

Numbers (prices in cents, quantities), lists, errors the agent must read (out of stock, unknown item), and calls
that depend on each other (an order needs a cart; a refund needs an order). Deterministic: no clock, no
randomness, all state in public attributes, which is what validation by execution needs.
"""

from __future__ import annotations


class Shop:
    """A shop with a stock of items, one customer cart, and the orders placed so far."""

    def __init__(self) -> None:
        self.stock: dict[str, int] = {}
        self.prices: dict[str, int] = {}
        self.cart: dict[str, int] = {}
        self.orders: list[dict] = []
        self.refunded: list[int] = []

    def reset(self, stock: dict | None = None, prices: dict | None = None) -> None:
        """Start an episode with a stock (item -> quantity) and prices (item -> cents)."""
        self.stock = dict(stock or {"apple": 5, "pear": 2, "milk": 3})
        self.prices = dict(prices or {"apple": 50, "pear": 80, "milk": 120})
        self.cart, self.orders, self.refunded = {}, [], []

    def list_items(self) -> list:
        """List the items the shop sells, with the quantity in stock and the price in cents."""
        return [{"item": item, "in_stock": self.stock[item], "price": self.prices[item]} for item in sorted(self.stock)]

    def add_to_cart(self, item: str, quantity: int = 1) -> str:
        """Put an item in the cart.

        Args:
            item: The item's name, as list_items shows it.
            quantity: How many to add; at least 1.
        """
        if item not in self.stock:
            raise ValueError(f"no item {item!r}")
        if quantity < 1:
            raise ValueError("quantity must be at least 1")
        if self.cart.get(item, 0) + quantity > self.stock[item]:
            raise ValueError(f"only {self.stock[item]} {item} in stock")
        self.cart[item] = self.cart.get(item, 0) + quantity
        return f"{self.cart[item]} {item} in the cart"

    def remove_from_cart(self, item: str) -> str:
        """Take an item out of the cart entirely.

        Args:
            item: The item's name.
        """
        if item not in self.cart:
            raise ValueError(f"{item!r} is not in the cart")
        del self.cart[item]
        return f"{item} removed"

    def cart_total(self) -> int:
        """The price of everything in the cart, in cents."""
        return sum(self.prices[item] * quantity for item, quantity in self.cart.items())

    def checkout(self) -> dict:
        """Place an order for everything in the cart: the stock goes down, the cart empties, and the order's number
        and total come back."""
        if not self.cart:
            raise ValueError("the cart is empty")
        total = self.cart_total()
        for item, quantity in self.cart.items():
            self.stock[item] -= quantity
        self.orders.append({"number": len(self.orders) + 1, "items": dict(self.cart), "total": total})
        self.cart = {}
        return {"order": len(self.orders), "total": total}

    def refund(self, order: int) -> str:
        """Refund an order: its items go back into stock.

        Args:
            order: The order number checkout gave.
        """
        if not 1 <= order <= len(self.orders):
            raise ValueError(f"no order {order}")
        if order in self.refunded:
            raise ValueError(f"order {order} is already refunded")
        for item, quantity in self.orders[order - 1]["items"].items():
            self.stock[item] += quantity
        self.refunded.append(order)
        return f"order {order} refunded"
