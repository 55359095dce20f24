"""`lantern serve`: the site, the browser runtime and artifacts over HTTP (and, in time, the
OpenAI-compatible cloud fallback running the artifact's CPU library)."""
