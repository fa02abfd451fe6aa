from pathlib import Path

import pytest

REAL_TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "real_traces"


@pytest.fixture(scope="session")
def real_traces() -> Path:
    if not REAL_TRACES.is_dir():
        pytest.fail(f"real traces not found at {REAL_TRACES}: the repo must sit beside shared/")
    return REAL_TRACES


# Browser tests (dash_duo): Debian's chromium and chromium-driver, headless. `.ci/run` installs
# them; a machine without them fails these tests (it never skips them).
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                  "--disable-background-networking", "--window-size=1400,1000")


def pytest_setup_options():
    """dash_duo's browser options: headless Debian chromium with console logs collected."""
    import shutil

    from selenium.webdriver.chrome.options import Options

    binary = CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium")
    if binary is None or shutil.which("chromedriver") is None:
        pytest.fail("chromium and chromedriver are needed for the dashboard's browser tests: "
                    "apt-get update && apt-get install -y chromium chromium-driver (.ci/run does it)")
    options = Options()
    options.binary_location = binary
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    return options


def console_errors(duo) -> list[dict]:
    """The browser console's errors (level SEVERE) since the page was opened."""
    return [e for e in duo.get_logs() if e["level"] == "SEVERE"]
