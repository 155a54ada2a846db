/* mil_lexer.c -- splits MIL text into tokens. Every read is guarded by
 * `pos < len`: the text is not NUL-terminated and may end anywhere. */
#include "mil_lexer.h"

void mil_lexer_init(mil_lexer *lx, const char *text, size_t len) {
    lx->text = text;
    lx->len = len;
    lx->pos = 0;
    lx->line = 1;
    lx->column = 1;
}

static int at(const mil_lexer *lx, size_t off) {
    return lx->pos + off < lx->len ? (unsigned char)lx->text[lx->pos + off] : -1;
}

static void advance(mil_lexer *lx) {
    if (lx->pos >= lx->len) return;
    if (lx->text[lx->pos] == '\n') {
        lx->line++;
        lx->column = 1;
    } else {
        lx->column++;
    }
    lx->pos++;
}

static int is_alpha(int c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static int is_digit(int c) { return c >= '0' && c <= '9'; }

static void skip_blanks(mil_lexer *lx) {
    for (;;) {
        int c = at(lx, 0);
        if (c == ' ' || c == '\t' || c == '\r' || c == '\n') {
            advance(lx);
        } else if (c == '/' && at(lx, 1) == '/') {
            while (lx->pos < lx->len && lx->text[lx->pos] != '\n') advance(lx);
        } else {
            return;
        }
    }
}

static mil_token error_token(mil_token t, const char *why) {
    t.kind = TOK_ERROR;
    t.error = why;
    return t;
}

mil_token mil_lexer_next(mil_lexer *lx) {
    skip_blanks(lx);
    mil_token t = {0};
    t.start = lx->text + lx->pos;
    t.line = lx->line;
    t.column = lx->column;
    size_t begin = lx->pos;
    int c = at(lx, 0);
    if (c < 0) {
        t.kind = TOK_EOF;
        return t;
    }
    if (is_alpha(c)) {
        while (is_alpha(at(lx, 0)) || is_digit(at(lx, 0))) advance(lx);
        t.kind = TOK_IDENT;
    } else if (is_digit(c) || (c == '.' && is_digit(at(lx, 1)))) {
        // A maximal run of number characters; the parser validates its form,
        // so "1.2.3" or "12abc" become one bad number rather than two tokens.
        int hex = c == '0' && (at(lx, 1) == 'x' || at(lx, 1) == 'X');
        for (;;) {
            int d = at(lx, 0);
            if (is_alpha(d) || is_digit(d) || d == '.') {
                advance(lx);
            } else if ((d == '+' || d == '-') && lx->pos > begin) {
                int prev = (unsigned char)lx->text[lx->pos - 1];
                int exp = hex ? (prev == 'p' || prev == 'P') : (prev == 'e' || prev == 'E');
                if (!exp) break;
                advance(lx);
            } else {
                break;
            }
        }
        t.kind = TOK_NUMBER;
    } else if (c == '"') {
        advance(lx);
        for (;;) {
            int d = at(lx, 0);
            if (d < 0 || d == '\n') return error_token(t, "unterminated string");
            if (d < 0x20 || d == 0x7f) return error_token(t, "control character in a string");
            advance(lx);
            if (d == '"') break;
            if (d == '\\') {
                int e = at(lx, 0);
                if (e != '"' && e != '\\' && e != 'n' && e != 't')
                    return error_token(t, "unknown escape in a string (use \\\" \\\\ \\n \\t)");
                advance(lx);
            }
        }
        t.kind = TOK_STRING;
    } else if (c == '-' && at(lx, 1) == '>') {
        advance(lx);
        advance(lx);
        t.kind = TOK_ARROW;
    } else if (c == '(' || c == ')' || c == '[' || c == ']' || c == '{' || c == '}' || c == '<' ||
               c == '>' || c == ',' || c == '=' || c == ';' || c == '-') {
        advance(lx);
        t.kind = TOK_PUNCT;
        t.punct = (char)c;
    } else {
        return error_token(t, "unexpected character");
    }
    t.len = lx->pos - begin;
    return t;
}
