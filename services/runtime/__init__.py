"""What every service process shares: the process entry (signals, logging, torch threads), settings declared once
(flags, environment, the README table), the NATS connection, and one service lifecycle (`lifecycle.run_service`).

A service package supplies only its settings class, its endpoints and its tasks.
"""
