"""santhrottle.bridge."""
