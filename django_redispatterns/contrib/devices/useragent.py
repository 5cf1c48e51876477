"""A small user-agent reader for the devices page: browser, operating system, device kind.

It recognises the common browsers and systems by the tokens they have sent for years, in
the order that matters (Edge and Opera also say "Chrome", Chrome also says "Safari", every
browser says "Mozilla"). Anything else reads as "Unknown browser" / "Unknown system": the
page then still shows the stored user agent itself. It never raises and never looks beyond
the first 300 characters (what the session engine stores).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["UserAgent", "parse_user_agent"]

MAX_LENGTH = 300

# (browser name, pattern whose group 1 is the version), first match wins.
_BROWSERS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (name, re.compile(pattern)) for name, pattern in (
        ("Edge", r"\bEdg(?:e|A|iOS)?/(\d+)"),
        ("Opera", r"\b(?:OPR|Opera)/(\d+)"),
        ("Samsung Internet", r"\bSamsungBrowser/(\d+)"),
        ("Vivaldi", r"\bVivaldi/(\d+)"),
        ("Yandex Browser", r"\bYaBrowser/(\d+)"),
        ("Firefox", r"\b(?:Firefox|FxiOS)/(\d+)"),
        ("Chromium", r"\bChromium/(\d+)"),
        ("Chrome", r"\b(?:HeadlessChrome|Chrome|CriOS)/(\d+)"),
        ("Safari", r"\bVersion/(\d+)(?:[.\d]*)(?: Mobile/\w+)? Safari/"),
        ("Internet Explorer", r"\b(?:MSIE |Trident/.*\brv:)(\d+)"),
        ("curl", r"^curl/(\d+)"),
        ("Python requests", r"^python-requests/(\d+)"),
        ("Python", r"^Python-urllib/(\d+)"),
        ("Wget", r"^Wget/(\d+)"),
    )
)

_WINDOWS = re.compile(r"\bWindows NT (\d+\.\d+)")
_WINDOWS_NAMES = {"10.0": "Windows", "6.3": "Windows 8.1", "6.2": "Windows 8",
                  "6.1": "Windows 7", "6.0": "Windows Vista", "5.1": "Windows XP"}
_IOS = re.compile(r"\b(?:iPhone|CPU) OS (\d+)")
_ANDROID = re.compile(r"\bAndroid (\d+)")


@dataclass(frozen=True)
class UserAgent:
    """What a user agent string says: ``browser`` ("Firefox 121"), ``os`` ("Android 14"),
    ``device`` ("phone", "tablet", "desktop" or "unknown")."""

    browser: str
    os: str
    device: str

    def __str__(self) -> str:
        return f"{self.browser} on {self.os}"


def _browser(ua: str) -> str:
    for name, pattern in _BROWSERS:
        found = pattern.search(ua)
        if found:
            return f"{name} {found.group(1)}"
    return "Unknown browser"


def _system(ua: str) -> tuple[str, str]:
    """(operating system, device kind)."""
    if "iPad" in ua:
        found = _IOS.search(ua)
        return (f"iPadOS {found.group(1)}" if found else "iPadOS"), "tablet"
    if "iPhone" in ua or "iPod" in ua:
        found = _IOS.search(ua)
        return (f"iOS {found.group(1)}" if found else "iOS"), "phone"
    found = _ANDROID.search(ua)
    if found or "Android" in ua:
        name = f"Android {found.group(1)}" if found else "Android"
        return name, "phone" if "Mobile" in ua else "tablet"
    found = _WINDOWS.search(ua)
    if found:
        return _WINDOWS_NAMES.get(found.group(1), "Windows"), "desktop"
    if "Windows" in ua:
        return "Windows", "desktop"
    if "CrOS" in ua:
        return "ChromeOS", "desktop"
    if "Macintosh" in ua or "Mac OS X" in ua:  # every browser freezes the version at 10.15
        return "macOS", "desktop"
    if "Linux" in ua or "X11" in ua:
        return "Linux", "desktop"
    return "Unknown system", "unknown"


def parse_user_agent(user_agent: str | None) -> UserAgent:
    """Read ``user_agent``; never raises (an empty or strange string gives "Unknown ...")."""
    ua = (user_agent or "")[:MAX_LENGTH]
    os_name, kind = _system(ua)
    return UserAgent(browser=_browser(ua), os=os_name, device=kind)
