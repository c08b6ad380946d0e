// Package docs holds Quill's reference documentation; its test checks the README's length and every relative link.
package docs
