"""santhrottle.controller."""
