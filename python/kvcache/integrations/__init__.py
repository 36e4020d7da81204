"""kvcache behind serving engines: storage backends for engines that key their own pages.

    kvcache.integrations.sglang  KvcacheHiCacheStorage: SGLang's HiCache storage (L3) backend
    kvcache.integrations.vllm    KvcacheSecondaryTier: a secondary tier of vLLM's offloading
                                 connector

Both store the engine's host-memory pages in a caller-keyed namespace under the engine's own
page keys (docs/integrations.md). Neither engine is imported unless it is installed: the
adapters keep to their interfaces without them, and the tests drive them through the call
sequences the engines make.
"""
