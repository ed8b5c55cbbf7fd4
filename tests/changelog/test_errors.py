"""The one redaction of credentials (`changelog.errors.redact`): URLs and libpq connection strings, in every form
a password can take, parsed or not, found in any text."""

from __future__ import annotations

import pytest

from changelog.errors import PgDsnInvalid, redact, url_password

SECRET = "s3cr-Et"


@pytest.mark.parametrize(
    "dsn",
    [
        f"postgresql://u:{SECRET}@[::1:5433/mview",  # does not parse: an IPv6 address without "]"
        f"postgresql://u:{SECRET}@h:5433/mview",
        f"postgres://:{SECRET}@h/db?sslmode=require",
        f"postgresql://h/db?user=u&password={SECRET}",
        f"host=h port=5433 user=u password={SECRET}",
        f"host=h password = {SECRET} dbname=d",
        f"host=h password='{SECRET}' dbname=d",
        f"host=h password='{SECRET}",  # an unclosed quote
        f"host=h sslpassword={SECRET}",
        f"redis://:{SECRET}@h:6379/0",
    ],
)
def test_every_form_of_a_password_is_masked_in_any_text(dsn):
    assert url_password(dsn) == SECRET
    text = f'invalid dsn: "{dsn}" in connection info string'
    assert SECRET not in redact(text, dsn)
    assert SECRET not in redact(text)  # without knowing the DSN: by its form alone
    assert "***" in redact(text)


def test_a_known_password_is_masked_wherever_it_appears_and_the_rest_is_kept():
    dsn = f"host=h port=5433 user=u password={SECRET}"
    assert redact(f"auth with {SECRET} failed at host=h", dsn) == "auth with *** failed at host=h"
    assert redact("postgresql://U:PASSWORD@H:P/D and host=h port=1", dsn) == (
        "postgresql://U:PASSWORD@H:P/D and host=h port=1"  # an advice's placeholder, no password
    )
    assert redact("PG_DSN (host=h port=5433 user=u) refused the credentials", dsn, None, "") == (
        "PG_DSN (host=h port=5433 user=u) refused the credentials"
    )


def test_a_dsn_parse_error_masks_the_pieces_after_the_password_libpq_quotes():
    dsn = "host=h port=5433 password=Top Secret-x9 dbname=d"  # a space in an unquoted password
    error = PgDsnInvalid('invalid dsn: missing "=" after "Secret-x9" in connection info string', dsn)
    assert "Secret-x9" not in str(error) and "Top" not in str(error)
    assert 'missing "=" after "***"' in str(error) and "\n" not in str(error)
    kept = PgDsnInvalid('invalid dsn: missing "=" after "port" in connection info string', "host=h port")
    assert 'after "port"' in str(kept)
