"""An app whose import raises (a missing setting, say)."""

raise RuntimeError("SHOP_API_KEY is not set")
