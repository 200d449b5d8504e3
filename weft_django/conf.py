"""Placeholder: replaced by the settings module."""


def autodiscover_module() -> str:
    return "workflows"
