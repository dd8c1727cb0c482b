"""2captcha-python, unchanged, with its default server (https://2captcha.com) and only
HTTPS_PROXY and REQUESTS_CA_BUNDLE set: solves a normal (multipart image) task and a
reCAPTCHA token task. Prints one JSON line per solve. Run by tests/real_clients.rs."""

import json
import os
import sys

from twocaptcha import TwoCaptcha

key = os.environ["CALLER_KEY"]
image = sys.argv[1]
# Short polling so the test takes seconds, not the library's default 10 s per poll.
solver = TwoCaptcha(key, pollingInterval=1, defaultTimeout=60, recaptchaTimeout=60)

normal = solver.normal(image)
print(json.dumps({"kind": "normal", "id": normal["captchaId"], "code": normal["code"]}), flush=True)

token = solver.recaptcha(sitekey="6Le-wvkSAAAAAPBMRTvw0Q4Muexq9bi0DJwx_mJ-", url="https://example.com/login")
print(json.dumps({"kind": "token", "id": token["captchaId"], "code": token["code"]}), flush=True)
