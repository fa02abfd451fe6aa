"""PLACEHOLDER: being written."""

from dash import html

PATH = "/compare"
NAME = "Compare"


def layout(store, entry, params):
    return html.Div("todo")


def register(app, store):
    return None
