"""Issue 24 §3: a downloaded file's name is safe whatever its row holds
(roles/ingress/api/files.py ``_disposition``): the ASCII ``filename=`` without
control, bidi or quote characters, the UTF-8 ``filename*=`` without control
or bidi characters (a right-to-left override was kept, percent-encoded)."""

from roles.ingress.api.files import _disposition


def test_a_right_to_left_override_and_controls_never_reach_the_name():
    said = _disposition("docs/invoice\u202efdp.exe")
    assert said == "attachment; filename=\"invoicefdp.exe\"; filename*=UTF-8''invoicefdp.exe"
    said = _disposition("a\x00b\r\nc\u2066d\"e\\f%g.txt")
    assert "%E2%81%A6" not in said and "%00" not in said and "%0D" not in said
    assert said.startswith("attachment; filename=\"abcd_ef_g.txt\"; filename*=UTF-8''")


def test_a_name_of_nothing_safe_is_file_and_accents_are_kept_in_the_utf8_name():
    assert _disposition("a/\u202e").startswith('attachment; filename="file"')
    assert _disposition("résumé.pdf") == \
        "attachment; filename=\"r_sum_.pdf\"; filename*=UTF-8''r%C3%A9sum%C3%A9.pdf"
