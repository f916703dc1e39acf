"""Model providers: OpenAI-compatible, Anthropic, and the scripted offline server."""
