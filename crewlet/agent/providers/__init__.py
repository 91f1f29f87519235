"""Model providers: what answers a seat's conversation.

==========  =================================================================
base        Provider, ProviderError, CoolingDown; the HTTP retry loop (the only
            one in crewlet), 429 cooldowns shared through ``cooldowns``
scripted    deterministic and offline: rules turn mail into replies and tool
            calls (the sample company's provider)
openai      any OpenAI-compatible chat completions endpoint, with tool calls
anthropic   Anthropic's Messages API, with tool use
cli         a CLI agent run per call in its own process group, bounded by
            ``max_concurrent``
==========  =================================================================

:func:`make_provider` builds one from a company's ``providers.<name>``; a
process keeps one instance per name and shares it across its seats (the cli
provider's bound lives in the instance). Token usage comes back in
``Reply.usage``; the turn loop adds it to ``budgets``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from crewlet.agent.providers.anthropic import AnthropicProvider
from crewlet.agent.providers.base import CoolingDown, Provider, ProviderError
from crewlet.agent.providers.cli import CliProvider
from crewlet.agent.providers.openai import OpenAIProvider
from crewlet.agent.providers.scripted import ScriptedProvider
from crewlet.company.model import Provider as ProviderSpec

if TYPE_CHECKING:
    from crewlet.coord.counters import Cooldowns
    from crewlet.vault import Vault

__all__ = ["CoolingDown", "Provider", "ProviderError", "make_provider"]

_KINDS: dict[str, type[Provider]] = {
    "scripted": ScriptedProvider,
    "openai": OpenAIProvider,
    "anthropic": AnthropicProvider,
    "cli": CliProvider,
}


def make_provider(name: str, spec: ProviderSpec, *, cooldowns: Cooldowns | None = None,
                  env: Mapping[str, str] = os.environ, vault: Vault | None = None) -> Provider:
    """The provider *name* configured by *spec*. *cooldowns*: the fleet's (None: this
    instance's own memory only); *env*: where ``api_key_env`` is read, and the cli
    agent's environment; *vault*: where ``api_key_secret`` is read (this process's)."""
    return _KINDS[spec.kind](name, spec, cooldowns=cooldowns, env=env, vault=vault)
