"""The official captchaai SDK, unchanged, with its default base URL
(https://ocr.captchaai.com) and only HTTPS_PROXY and SSL_CERT_FILE set: solves a normal
(image) task and a reCAPTCHA v2 token task. Prints one JSON line per solve. Run by
tests/real_clients.rs."""

import json
import os
import sys

from captchaai import CaptchaAI

client = CaptchaAI(api_key=os.environ["CALLER_KEY"])
with open(sys.argv[1], "rb") as f:
    image = f.read()

normal = client.normal(image)
print(json.dumps({"kind": "normal", "id": normal.task_id, "code": normal.raw_text}), flush=True)

token = client.recaptcha_v2(sitekey="6Le-wvkSAAAAAPBMRTvw0Q4Muexq9bi0DJwx_mJ-", url="https://example.com/login")
print(json.dumps({"kind": "token", "id": token.task_id, "code": token.raw_text}), flush=True)
client.close()
