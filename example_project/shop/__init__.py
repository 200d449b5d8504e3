"""The example app: an order pipeline defined in workflows.py."""
