"""Small trace files in every supported layout, as text the tests write to tmp_path."""

from __future__ import annotations

AZURE_2023 = (
    "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    "2023-11-16 18:15:46.6805900,374,44\n"
    "2023-11-16 18:15:50.9951690,396,109\n"
    "2023-11-16 18:15:51.2224671,879,55\n"
)
AZURE_2024 = (
    "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    "2024-05-10 00:00:00.009930+00:00,2162,5\n"
    "2024-05-10 00:00:01+00:00,2399,6\n"
    "2024-05-10 02:00:00.022314+02:00,76,15\n"
)
MOONCAKE = (
    '{"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1, 2, 3]}\n'
    '{"timestamp": 3000, "input_length": 7322, "output_length": 490, "hash_ids": [0, 14, 15]}\n'
    '{"timestamp": 3000, "input_length": 7236, "output_length": 794, "hash_ids": [0, 1, 2, 9]}\n'
    '{"timestamp": 6500, "input_length": 300, "output_length": 3, "hash_ids": [0]}\n'
)
BURSTGPT = (
    "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
    "5,ChatGPT,472,18,490,Conversation log\n"
    "45,ChatGPT,1087,0,1087,Conversation log\n"
    "118,GPT-4,417,276,693,API log\n"
    "120,GPT-4,20,7,27,API log\n"
)
CANONICAL_CSV = (
    "request_id,arrival_s,prompt_tokens,output_tokens,prompt_key\n"
    "a,0.0,100,10,tmpl-1\n"
    "b,0.5,200,20,\n"
    "c,1.25,300,30,NA\n"
)
