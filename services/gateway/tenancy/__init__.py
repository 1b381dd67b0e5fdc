"""Who a request is for: API keys named in a keys file, each with its limits and priority (issue 42)."""
