"""PLACEHOLDER: being written."""

from dash import html

PATH = "/findings"
NAME = "Findings"


def layout(store, entry, params):
    return html.Div("todo")


def register(app, store):
    return None
