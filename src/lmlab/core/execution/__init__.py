"""Running what a model wrote or calls: the sandbox (and its in-sandbox runner), tools, API backends."""
