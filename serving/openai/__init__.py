"""The OpenAI wire format as vLLM and SGLang speak it, defined once for the gateway, the engine
emulator and ``bench``: request bodies (:mod:`.requests`), answers, the usage and the error body
(:mod:`.responses`), and Server-Sent Events (:mod:`.sse`)."""
