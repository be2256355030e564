"""The AI provider's side: the API channel (settings.json's base URL and key), and the
guide's ping."""
