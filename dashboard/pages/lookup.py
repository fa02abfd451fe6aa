"""PLACEHOLDER: being written."""

from dash import html

PATH = "/lookup"
NAME = "Problem lookup"


def layout(store, entry, params):
    return html.Div("todo")


def register(app, store):
    return None
