"""anticaptchaofficial, unchanged, with its own host (https://api.anti-captcha.com) and only
HTTPS_PROXY and REQUESTS_CA_BUNDLE set. `solve`: an image task, a reCAPTCHA v2 task and a
balance read; `unsolvable`: an image task the service cannot solve. Prints one JSON line
each. Run by tests/real_json_clients.rs."""

import json
import os
import sys

from anticaptchaofficial.imagecaptcha import imagecaptcha
from anticaptchaofficial.recaptchav2proxyless import recaptchaV2Proxyless

key = os.environ["CALLER_KEY"]
mode, image = sys.argv[1], sys.argv[2]


def out(**line):
    print(json.dumps(line), flush=True)


solver = imagecaptcha()
solver.set_verbose(0)
solver.set_key(key)
if mode == "solve":
    out(kind="image", code=solver.solve_and_return_solution(image))
    recaptcha = recaptchaV2Proxyless()
    recaptcha.set_verbose(0)
    recaptcha.set_key(key)
    recaptcha.set_website_url("https://example.com/login")
    recaptcha.set_website_key("6Le-wvkSAAAAAPBMRTvw0Q4Muexq9bi0DJwx_mJ-")
    out(kind="token", code=recaptcha.solve_and_return_solution())
    out(kind="balance", balance=solver.get_balance())
else:
    result = solver.solve_and_return_solution(image)
    out(kind="error", result=result, code=solver.error_code, text=solver.err_string)
