"""Sending one email over SMTP, saying exactly how far it got.

:class:`Mailer` keeps one connection to the node's SMTP server (Tier A
``smtp:``) open between sends and gives each :meth:`Mailer.send` one of four
verdicts, which is all the sender duty needs to keep its promise of
at-most-once:

* ``sent`` — the server accepted the message (250 after DATA);
* ``retry`` — it did not get the message, and says it may later: no
  connection, a 4xx at any step (the server's answer is the proof nothing
  was accepted);
* ``dead`` — it refused for good: a 5xx at any step, with its words;
* ``unknown`` — the connection broke or timed out *after* the message was
  handed over and before the answer: it may have been delivered.

Each SMTP step is its own call (MAIL, RCPT, DATA), so a failure is placed
before or after the hand-over rather than guessed.
"""

from __future__ import annotations

import asyncio
import email.utils
import hashlib
from dataclasses import dataclass
from email.message import EmailMessage

import aiosmtplib

from crewlet.config.model import SmtpSection
from crewlet.outbox import Notification

SENT, RETRY, DEAD, UNKNOWN = "sent", "retry", "dead", "unknown"
# The header that names the notification in every email (a recipient's filter,
# a test's count of duplicates).
ID_HEADER = "X-Crewlet-Notification"


@dataclass(frozen=True)
class Verdict:
    state: str     # sent | retry | dead | unknown
    reason: str    # the server's words, or what went wrong


def message(n: Notification, sender: str) -> bytes:
    msg = EmailMessage()
    msg["From"] = sender
    msg["To"] = ", ".join(n.to)
    msg["Subject"] = n.subject
    msg["Date"] = email.utils.formatdate(localtime=False)
    # The same id every time it is sent: a recipient's client may fold duplicates.
    msg["Message-ID"] = f"<{hashlib.sha256(n.id.encode()).hexdigest()[:32]}@crewlet>"
    msg[ID_HEADER] = n.id
    msg.set_content(n.body or " ")
    return msg.as_bytes()


def _answer(exc: aiosmtplib.SMTPResponseException) -> Verdict:
    words = f"{exc.code} {exc.message}"
    return Verdict(DEAD if 500 <= exc.code < 600 else RETRY, words)


class Mailer:
    """One SMTP connection, opened when needed, dropped after any failure."""

    def __init__(self, config: SmtpSection):
        self.config = config
        self._smtp: aiosmtplib.SMTP | None = None

    async def _connected(self) -> aiosmtplib.SMTP:
        if self._smtp is not None and self._smtp.is_connected:
            return self._smtp
        c = self.config
        smtp = aiosmtplib.SMTP(hostname=c.host, port=c.port, timeout=c.timeout,
                               use_tls=c.tls == "implicit",
                               start_tls=True if c.tls == "starttls" else False)
        await smtp.connect()
        if c.username is not None:
            await smtp.login(c.username, c.password() or "")
        self._smtp = smtp
        return smtp

    async def close(self) -> None:
        smtp, self._smtp = self._smtp, None
        if smtp is not None and smtp.is_connected:
            try:
                await asyncio.wait_for(smtp.quit(), 2.0)
            except Exception:
                smtp.close()

    def _drop(self) -> None:
        smtp, self._smtp = self._smtp, None
        if smtp is not None:
            smtp.close()

    async def send(self, n: Notification) -> Verdict:
        """Send *n* once; never raises but CancelledError."""
        try:
            smtp = await self._connected()
        except (aiosmtplib.SMTPException, OSError, asyncio.TimeoutError) as exc:
            # Not this notification's fault (a refused login, a server away,
            # even a 5xx greeting): retried, and dead only when its sends are spent.
            self._drop()
            return Verdict(RETRY, f"connecting to {self.config.host}:{self.config.port}: "
                                  f"{type(exc).__name__}: {exc}")
        # Before DATA nothing was handed over: any failure may be retried.
        try:
            await smtp.mail(self.config.sender)
            for to in n.to:
                await smtp.rcpt(to)
        except aiosmtplib.SMTPResponseException as exc:
            await self._reset(smtp)
            return _answer(exc)
        except (aiosmtplib.SMTPException, OSError, asyncio.TimeoutError) as exc:
            self._drop()
            return Verdict(RETRY, f"{type(exc).__name__}: {exc}")
        try:
            answer = await smtp.data(message(n, self.config.sender))
        except aiosmtplib.SMTPResponseException as exc:
            # The server answered: it did not take it (4xx later, 5xx never).
            await self._reset(smtp)
            return _answer(exc)
        except (aiosmtplib.SMTPException, OSError, asyncio.TimeoutError) as exc:
            # Handed over, no answer: it may have been delivered.
            self._drop()
            return Verdict(UNKNOWN, f"no answer after the message: {type(exc).__name__}: {exc}")
        return Verdict(SENT, f"{answer.code} {answer.message}")

    async def _reset(self, smtp: aiosmtplib.SMTP) -> None:
        try:
            await smtp.rset()
        except Exception:
            self._drop()
