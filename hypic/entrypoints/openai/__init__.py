"""``hypic serve``: an OpenAI- and SGLang-compatible HTTP server over
:class:`~hypic.engine.async_engine.AsyncLLMEngine` (one engine loop, continuous batching).

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions`` (OpenAI shapes, ``stream`` as SSE
``data: {...}`` chunks ending in ``data: [DONE]``, ``stream_options.include_usage``, ``n``,
``stop``, ``seed``, ``max_tokens`` / ``max_completion_tokens``, ``temperature``, ``top_p``, vLLM's
``logprobs`` / ``top_logprobs``, ``presence_penalty``, ``frequency_penalty``, ``logit_bias``, vLLM's
``repetition_penalty`` / ``min_p`` / ``min_tokens`` (:class:`~hypic.engine.sampling_params.SamplingParams`
has their meaning), ``top_k`` / ``ignore_eos`` / ``stop_token_ids`` / ``return_token_ids`` (completions: each choice and
each streamed chunk carries its token ids, so a client without the tokenizer counts and times
tokens), and ``cache_salt``: a tenant's segments never hit under another salt; a stream sends one
chunk per engine step that produced tokens, with empty text while a stop string may still match),
``POST /generate`` (SGLang: ``text`` or ``input_ids``, ``sampling_params`` with SGLang's names,
``min_new_tokens`` and the penalties included, ``stream``; ``meta_info``
with prompt, completion and cached tokens), ``GET /v1/models``, ``GET /health``, ``GET /metrics`` (Prometheus),
``POST /tokenize``, ``POST /detokenize``, ``POST /flush_cache`` (drops the segment-store entries no
request holds). ``echo`` (completions; streamed, the prompt goes out with the first token) returns the prompt's
text before the completion and, with ``logprobs``, the prompt tokens' log-probabilities before the completion's:
such a request is prefilled in full (``SamplingParams.prompt_logprobs``), the request an
evaluation harness sends for a log-likelihood. ``suffix``, ``best_of`` other than ``n`` and tools
are refused with a 400.

Segmented prompts (position-independent caching), three ways; the last piece (the question) is
never cached:

* ``<<PIC_SEP>>`` between segments inside the text: ``"prompt": "doc A<<PIC_SEP>>doc B<<PIC_SEP>>question"``
  (completions, ``/generate``'s ``text``, or the last chat message's content);
* ``"segments": ["doc A", "doc B", "question"]`` instead of ``prompt`` / ``text`` (each item a
  string or a token-id list);
* a chat message whose content is a list of text parts: each part of the last message is a
  segment, the chat template's text around them is its own first segment / joins the query.

``max_tokens``: prompt + max_tokens must fit ``max_model_len`` (else 400). Omitted, it is 16 for
completions (OpenAI's default), the room left under max_model_len for chat, and 128 for
``/generate`` (SGLang's default). ``usage.prompt_tokens_details.cached_tokens`` counts prompt
tokens reused from the segment store; ``usage.pic`` splits them into segment and prefix hits and
gives the tokens computed live.

    hypic serve tiny --port 8000
    python3 -c "import openai; c = openai.OpenAI(base_url='http://127.0.0.1:8000/v1', api_key='x');
                print(c.completions.create(model='tiny', prompt='the mentor of kolton is', max_tokens=8,
                                           temperature=0).choices[0].text)"
"""
