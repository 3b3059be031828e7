"""The one decision core: error taxonomy, retries, breakers, deadline, hedging, degradation.

Private to the package: the routing facade and the LangChain wrappers drive it; users configure
it through :mod:`llm_resilience_plugin.policy`.
"""
