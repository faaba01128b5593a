"""santhrottled: the loop (loop.py), its control socket (control.py), metrics
(metrics.py), systemd notification (sdnotify.py) and its entry point (main.py,
which nothing else imports)."""
