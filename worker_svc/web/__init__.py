"""Reading the web safely: guarded fetching, extraction, and paged page views."""
