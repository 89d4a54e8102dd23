#!/bin/sh
# nginx in front of the replicas, in the foreground: deploy/nginx.conf with this deployment's ports filled in,
# its pid, logs and temporary files under $RAG_DEPLOY_DIR/nginx.
set -eu
dir="$RAG_DEPLOY_DIR/nginx"
mkdir -p "$dir/logs" "$dir/tmp"
envsubst '${APP1_PORT} ${APP2_PORT} ${PROXY_PORT} ${PROXY_HOST}' < "$(dirname "$0")/nginx.conf" > "$dir/nginx.conf"
exec nginx -p "$dir" -c "$dir/nginx.conf" -g 'daemon off;'
